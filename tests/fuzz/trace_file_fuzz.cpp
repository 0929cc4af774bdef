// libFuzzer target: cclite-trace's reader and report (tools/trace/): the
// flight recorder files it is given may be truncated, edited or not ours.
//
// The input is split at the first "\n--\n" into two files (e.g. two ranks of
// one communicator, so the cross-rank comparisons run); each is parsed, and
// when both parse, and also for each alone, the report is built. Any crash,
// sanitizer finding or libFuzzer timeout (a report that loops on the numbers
// a file holds) is a finding; a report must always name its file count.
#include "trace/report.hpp"
#include "trace/trace_file.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c)) std::abort(); \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = all.find("\n--\n");
  const std::string texts[2] = {all.substr(0, cut), cut == std::string::npos ? "" : all.substr(cut + 4)};
  std::vector<cclite_trace::process_dump> dumps;
  for (const std::string& t : texts) {
    std::istringstream in(t);
    cclite_trace::process_dump d;
    std::string err;
    if (cclite_trace::parse_dump(in, "fuzz", d, err)) {
      for (const auto& c : d.comms) FUZZ_ASSERT(c.size >= 1 && c.size <= (1 << 20) && c.rank >= 0 && c.rank < c.size);
      dumps.push_back(std::move(d));
    } else {
      FUZZ_ASSERT(err.compare(0, 5, "fuzz:") == 0);  // says which file (and line)
    }
  }
  for (std::size_t n = 1; n <= dumps.size(); ++n) {
    const std::vector<cclite_trace::process_dump> some(dumps.begin(), dumps.begin() + static_cast<long>(n));
    const std::string rep = cclite_trace::report(some);
    FUZZ_ASSERT(rep.find(" flight recorder file") != std::string::npos);
  }
  return 0;
}
