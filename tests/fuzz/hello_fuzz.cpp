// libFuzzer target: the TCP data transport's hello / ack frame
// (transports/tcp/include/cclite/tcp/hello.hpp): parse_hello + reject_reason,
// the validation every accepted data socket goes through.
//
// Input: 40 frame bytes, then optional bytes for the receiving side's
// (job hash, rank, size), so the fuzzer can also reach the accepting paths.
// A frame that reject_reason() accepts must satisfy every limit the acceptor
// and link rely on; a violation aborts.
#include <cclite/tcp/hello.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

using namespace cclite::tcp;

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c)) std::abort(); \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hello h;
  if (!parse_hello(data, size, h)) {
    FUZZ_ASSERT(size < hello_bytes);
    return 0;
  }
  // Receiver: by default the job the frame claims and the rank it addresses,
  // so that the deeper checks run; extra bytes override them.
  std::uint64_t job = h.job_hash;
  int me = h.to_rank, world = h.to_rank == INT32_MAX ? INT32_MAX : h.to_rank + 1;
  const std::uint8_t* x = data + hello_bytes;
  std::size_t nx = size - hello_bytes;
  if (nx >= 8) {
    std::uint32_t a = static_cast<std::uint32_t>(cclite::get_le(x, 4));
    std::uint32_t b = static_cast<std::uint32_t>(cclite::get_le(x + 4, 4));
    me = static_cast<int>(a % 1048576);
    world = me + 1 + static_cast<int>(b % 1048576);
  }
  if (nx >= 16) job = cclite::get_le(x + 8, 8);
  std::string why = reject_reason(h, job, me, world);
  if (why.empty()) {
    FUZZ_ASSERT(h.is_hello());
    FUZZ_ASSERT(h.version == hello_version && h.job_hash == job && h.to_rank == me);
    FUZZ_ASSERT(h.from_rank >= 0 && h.from_rank < me && h.from_rank < world);
    FUZZ_ASSERT(h.nsocks >= 1 && h.nsocks <= static_cast<std::uint32_t>(max_nsocks) && h.sock_index < h.nsocks);
    FUZZ_ASSERT(h.block >= min_block && h.block <= max_block && h.block % 8 == 0);
  } else {
    FUZZ_ASSERT(why.size() < 200);
  }
  // encode(decode(bytes)) gives the bytes back, the reserved word zeroed.
  std::uint8_t again[hello_bytes];
  encode(h, again);
  FUZZ_ASSERT(std::memcmp(again, data, 36) == 0);
  FUZZ_ASSERT(again[36] == 0 && again[37] == 0 && again[38] == 0 && again[39] == 0);
  return 0;
}
