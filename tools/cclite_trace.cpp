// cclite-trace: reads the flight recorder files of a job's processes
// (CCLITE_TRACE_BUFFER, CCLITE_TRACE_FILE; include/cclite/collective/
// flight_recorder.hpp) and says, per communicator, which ranks were in which
// call when the job failed, which never started it and what they were doing
// instead, and which collective the ranks first called differently.
//
//   cclite-trace /tmp/cclite-trace.*        (one file per process, every node's)
//
// Exit status: 0 report printed, 1 a file could not be read, 2 usage.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "trace/report.hpp"
#include "trace/trace_file.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: cclite-trace FILE...\n"
                 "  FILE: flight recorder files written by cclite processes run with CCLITE_TRACE_BUFFER=N\n"
                 "        (CCLITE_TRACE_FILE<host>.<pid>; default prefix /tmp/cclite-trace.), one per process\n");
    return argc < 2 ? 2 : 0;
  }
  std::vector<cclite_trace::process_dump> dumps;
  int bad = 0;
  for (int i = 1; i < argc; ++i) {
    cclite_trace::process_dump d;
    std::string err;
    if (!cclite_trace::read_dump(argv[i], d, err)) {
      std::fprintf(stderr, "cclite-trace: %s\n", err.c_str());
      ++bad;
      continue;
    }
    dumps.push_back(std::move(d));
  }
  if (!dumps.empty()) std::fputs(cclite_trace::report(dumps).c_str(), stdout);
  return bad ? 1 : 0;
}
