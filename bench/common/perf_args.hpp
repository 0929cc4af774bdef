// bench/common/perf_args.hpp - nccl-tests command line and output table, shared by
// every *_perf program (and by the MPI twin in compare_mpi, which has no cclite
// communicator: nothing here depends on one).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace bench {

struct perf_args {
  std::size_t min_bytes = 32 << 20, max_bytes = 32 << 20;
  double factor = 2;
  std::size_t step_bytes = 0;  // -i: additive step instead of a factor
  int iters = 20, warmup = 5;
  bool check = true;
  cclite::dtype type = cclite::dtype::float32;
  cclite::reduce_op op = cclite::reduce_op::sum;
  std::string json;  // -J file: JSON lines
};

/// Removes `flag VALUE` from argv and returns VALUE ("" when absent): the
/// cclite-only flags (-a ALGO, -r ROOT, -C COLLECTIVE) that the MPI twin and
/// parse_perf_args() do not know.
inline std::string take_flag(int& argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == flag) {
      std::string v = argv[i + 1];
      for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
      argc -= 2;
      return v;
    }
  }
  return "";
}

inline bool parse_size(const char* s, std::size_t& out) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v < 0) return false;
  switch (*end) {
    case 'K': case 'k': v *= 1024; ++end; break;
    case 'M': case 'm': v *= 1024 * 1024; ++end; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end == 'B') ++end;
  if (*end) return false;
  out = static_cast<std::size_t>(v);
  return true;
}

inline cclite::result<perf_args> parse_perf_args(int argc, char** argv, const char* prog) {
  using cclite::errc;
  using cclite::make_error;
  perf_args a;
  auto usage = [&](const char* why) {
    return make_error(errc::invalid_argument,
                      "%s: %s\nusage: %s [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes] "
                      "[-n iters] [-w warmup] [-c 0|1] [-d dtype] [-o sum|prod|min|max|avg|band|bor|bxor] "
                      "[-J file.json]",
                      prog, why, prog);
  };
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") return usage("help");
    if (i + 1 >= argc) return usage(("missing value after " + f).c_str());
    const char* v = argv[++i];
    if (f == "-b") { if (!parse_size(v, a.min_bytes)) return usage("bad -b"); }
    else if (f == "-e") { if (!parse_size(v, a.max_bytes)) return usage("bad -e"); }
    else if (f == "-f") { a.factor = std::atof(v); if (a.factor <= 1) return usage("-f must be > 1"); }
    else if (f == "-i") { if (!parse_size(v, a.step_bytes)) return usage("bad -i"); }
    else if (f == "-n") { a.iters = std::atoi(v); if (a.iters < 1) return usage("-n must be >= 1"); }
    else if (f == "-w") { a.warmup = std::atoi(v); if (a.warmup < 0) return usage("-w must be >= 0"); }
    else if (f == "-c") { a.check = std::atoi(v) != 0; }
    else if (f == "-J") { a.json = v; }
    else if (f == "-d") {
      bool found = false;
      for (int t = 0; t < cclite::dtype_count; ++t) {
        auto d = static_cast<cclite::dtype>(t);
        if (f.size() && (std::strcmp(v, cclite::to_string(d)) == 0 ||
                         (std::strcmp(v, "float16") == 0 && d == cclite::dtype::float16) ||
                         (std::strcmp(v, "float32") == 0 && d == cclite::dtype::float32) ||
                         (std::strcmp(v, "float64") == 0 && d == cclite::dtype::float64))) {
          a.type = d;
          found = true;
        }
      }
      if (!found) return usage("unknown -d dtype");
    } else if (f == "-o") {
      bool found = false;
      for (int o = 0; o < cclite::reduce_op_count; ++o)
        if (std::strcmp(v, cclite::to_string(static_cast<cclite::reduce_op>(o))) == 0) {
          a.op = static_cast<cclite::reduce_op>(o);
          found = true;
        }
      if (!found) return usage("unknown -o op");
    } else {
      return usage(("unknown flag " + f).c_str());
    }
  }
  if (!cclite::applies_to(a.op, a.type)) return usage("-o band, bor and bxor take an integer -d");
  std::size_t esz = cclite::size_of(a.type);
  if (a.min_bytes < esz) a.min_bytes = esz;
  if (a.max_bytes < a.min_bytes) return usage("-e is smaller than -b");
  return a;
}

inline std::size_t next_size(std::size_t bytes, const perf_args& a) {
  return a.step_bytes ? bytes + a.step_bytes : static_cast<std::size_t>(bytes * a.factor);
}

/// One output line: out-of-place and in-place results for one size.
struct perf_row {
  std::size_t bytes, count;
  double us[2] = {0, 0};
  std::size_t wrong[2] = {0, 0};
  void set(int in_place, double t, std::size_t w) {
    us[in_place] = t;
    wrong[in_place] = w;
  }
};

/// Prints nccl-tests columns on rank 0 and appends JSON lines to -J.
class perf_table {
 public:
  /// `impl` names the implementation in the header line and the JSON "impl" field
  /// (compare_mpi passes "mpi"; plot.sh and compare.sh key on it).
  perf_table(bool printer, const perf_args& a, const char* coll, int nranks, double bus_factor,
             const char* impl = "cclite")
      : on_(printer), a_(a), coll_(coll), impl_(impl), nranks_(nranks), factor_(bus_factor) {
    if (on_ && !a.json.empty()) json_ = std::fopen(a.json.c_str(), "a");
  }
  ~perf_table() {
    if (json_) std::fclose(json_);
  }

  void header(const char* transport) {
    if (!on_) return;
    std::printf("# %s %s_perf: %d ranks, %s %s, %d iters, %d warmup\n", impl_, coll_, nranks_,
                std::strcmp(impl_, "cclite") == 0 ? "ring via" : "via", transport, a_.iters,
                a_.warmup);
    std::printf("#%11s %12s %8s %6s   %30s   %30s\n", "", "", "", "", "out-of-place", "in-place");
    std::printf("#%11s %12s %8s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type",
                "redop", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("#%11s %12s %8s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  void print(const perf_row& r) {
    if (!on_) return;
    std::printf(" %11zu %12zu %8s %6s", r.bytes, r.count, cclite::to_string(a_.type),
                cclite::to_string(a_.op));
    for (int k = 0; k < 2; ++k) {
      double algbw = r.us[k] > 0 ? r.bytes / (r.us[k] * 1e3) : 0;
      double busbw = algbw * factor_;
      std::printf(" %9.2f %7.2f %7.2f %6zu", r.us[k], algbw, busbw, r.wrong[k]);
      if (k == 0) sum_busbw_ += busbw, ++rows_;
      if (json_) {
        std::fprintf(json_,
                     "{\"impl\":\"%s\",\"collective\":\"%s\",\"ranks\":%d,\"size\":%zu,"
                     "\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"inplace\":%d,"
                     "\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"wrong\":%zu}\n",
                     impl_, coll_, nranks_, r.bytes, r.count, cclite::to_string(a_.type),
                     cclite::to_string(a_.op), k, r.us[k], algbw, busbw, r.wrong[k]);
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  void footer() {
    if (!on_) return;
    std::printf("# Avg bus bandwidth    : %g\n", rows_ ? sum_busbw_ / rows_ : 0.0);
  }

 private:
  bool on_;
  perf_args a_;
  const char* coll_;
  const char* impl_;
  int nranks_;
  double factor_;
  FILE* json_ = nullptr;
  double sum_busbw_ = 0;
  int rows_ = 0;
};

}  // namespace bench
