#!/usr/bin/env bash
# bench/footprint.sh - what cclite costs a program: compile time, binary size,
# resident memory. Prints one table (the figures of README "Footprint").
#
#   bench/footprint.sh [CXX]          (default g++; run from anywhere)
#
#  1. compile time of samples/hello_allreduce.cpp (includes the umbrella header
#     cclite/cclite.hpp, shm + tcp) at -O2, and of samples/edge_sensor_average.cpp
#     (communicator<tcp> only): wall and user seconds, best of 2
#     and of hello_allreduce.cpp built with CCLITE_SEPARATE_COMPILATION (the
#     communicator's set-up compiled once, in samples/cclite_src.cpp: timed once,
#     it is compiled once per program)
#  2. stripped size of hello_allreduce linked with -static-libstdc++ -static-libgcc
#     and dynamically, and of edge_sensor_average (-O2, -s); and hello_allreduce
#     built for size (-Os) and as the embedded configuration (-Os -fno-exceptions
#     -fno-rtti, then also without unwind tables), dynamic; and where
#     hello_allreduce's -O2 code goes, by part of cclite (the last table; function
#     by function:
#       g++ -O2 ... -c samples/hello_allreduce.cpp && nm -C -S --size-sort hello_allreduce.o)
#  3. resident memory of each rank of a 2-rank job at rest (after set-up and
#     one 4-byte allreduce): VmRSS and Pss (/proc/self/status, smaps_rollup;
#     Pss splits shared pages, e.g. the shm FIFOs, between the ranks), with the
#     default buffers over shm and over tcp, and with the smallest ones
#     (CCLITE_SHM_BUFFSIZE=64K, CCLITE_TCP_BUFFSIZE=16K, CCLITE_NSOCKS=1,
#     CCLITE_CHUNKSIZE=4K, CCLITE_TCP_BLOCK=4K)
#
# Everything is built in a temporary directory; nothing in build/ is touched.
# Takes a few minutes (the umbrella header is compiled 11 times).
set -euo pipefail
CXX=${1:-g++}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/cclite-footprint-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
inc=(-I"$root/include" -I"$root/transports/shm/include" -I"$root/transports/tcp/include")
defs=(-DCCLITE_HAS_SHM=1 -DCCLITE_HAS_TCP=1)
tcp_defs=(-DCCLITE_HAS_TCP=1)
# What the cclite CMake target adds for GCC (CMakeLists.txt: a GCC mod/ref
# miscompile), so the figures are those of a program built against it.
if "$CXX" --version 2>/dev/null | grep -q 'Free Software Foundation'; then defs+=(-fno-ipa-modref); tcp_defs+=(-fno-ipa-modref); fi

# best-of-2 "wall user" seconds of a command
timed() {
  local best_w="" best_u=""
  for _ in 1 2; do
    /usr/bin/time -o "$tmp/time" -f "%e %U" "$@" >/dev/null
    local t w u
    t=$(tail -1 "$tmp/time")
    w=${t% *} u=${t#* }
    if [[ -z $best_w ]] || awk "BEGIN{exit !($w < $best_w)}"; then best_w=$w; best_u=$u; fi
  done
  echo "$best_w $best_u"
}

# Where the code of an object goes, by part of cclite: "KB functions part"
# (demangled names without template arguments, matched by pattern; sizes in
# decimal through nm -t d, since Debian's awk has no strtonum).
where() {
  nm -C -S --size-sort -t d "$1" | awk '
    $3 ~ /^[tTwW]$/ {
      size = $2 + 0; name = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", name)
      # the qualified name without template arguments, parameters or return type
      out = ""; depth = 0
      for (i = 1; i <= length(name); ++i) {
        c = substr(name, i, 1)
        if (c == "<") { ++depth; continue }
        if (c == ">") { --depth; continue }
        if (depth == 0 && c == "(") break
        if (depth == 0) out = out c
      }
      n = split(out, w, " "); q = w[n]
      if (q ~ /store|rendezvous|auth/) part = "stores and rendezvous (bootstrap/, tcp/store_*, tcp/rendezvous)"
      else if (q ~ /^cclite::tcp::/) part = "tcp transport"
      else if (q ~ /^cclite::shm::/) part = "shm transport (links, shm-direct)"
      else if (q ~ /ring_|tree|halving|recursive|hier_|primitives|p2p|chain_|barrier/) part = "algorithms and primitives"
      else if (q ~ /launch|env|topology|peer_info/) part = "launch environment, topology"
      else if (q ~ /^cclite::(detail::comm_|communicator|detail::work_queue|algorithm_selector|detail::call|detail::mismatch|detail::validate|init|env_communicator|cost)/) part = "communicator (dispatch, checks, queue, selection, set-up)"
      else if (q ~ /^cclite::/) part = "other cclite (status, result, logging, reduction kernels, ...)"
      else if (q ~ /^std::/) part = "std templates"
      else part = "other (main, runtime glue)"
      sum[part] += size; cnt[part]++; total += size
    }
    END {
      for (p in sum) printf "%6.1f KB %4d  %s\n", sum[p] / 1000, cnt[p], p | "sort -rn"
      close("sort -rn")
      printf "%6.1f KB        all functions\n", total / 1000
    }'
}

# 1. compile time -------------------------------------------------------------------
read -r hw hu < <(timed "$CXX" -std=c++17 -O2 "${defs[@]}" "${inc[@]}" -c "$root/samples/hello_allreduce.cpp" -o "$tmp/hello.o")
read -r sw su < <(timed "$CXX" -std=c++17 -O2 -DCCLITE_SEPARATE_COMPILATION "${defs[@]}" "${inc[@]}" \
  -c "$root/samples/hello_allreduce.cpp" -o "$tmp/hello_sep.o")
/usr/bin/time -o "$tmp/time" -f "%e %U" "$CXX" -std=c++17 -O2 -DCCLITE_SEPARATE_COMPILATION "${defs[@]}" "${inc[@]}" \
  -c "$root/samples/cclite_src.cpp" -o "$tmp/cclite_src.o"
read -r cw cu < <(tail -1 "$tmp/time")
read -r ew eu < <(timed "$CXX" -std=c++17 -O2 "${tcp_defs[@]}" -I"$root/include" -I"$root/transports/tcp/include" \
  -c "$root/samples/edge_sensor_average.cpp" -o "$tmp/edge.o")

# 2. sizes ----------------------------------------------------------------------------
"$CXX" "$tmp/hello.o" -o "$tmp/hello_static" -s -static-libstdc++ -static-libgcc -pthread
"$CXX" "$tmp/hello.o" -o "$tmp/hello_dyn" -s -pthread
"$CXX" "$tmp/hello_sep.o" "$tmp/cclite_src.o" -o "$tmp/hello_sep_dyn" -s -pthread -Wl,--gc-sections
"$CXX" "$tmp/edge.o" -o "$tmp/edge_static" -s -static-libstdc++ -static-libgcc -pthread
"$CXX" "$tmp/edge.o" -o "$tmp/edge_dyn" -s -pthread
"$CXX" -std=c++17 -Os "${defs[@]}" "${inc[@]}" "$root/samples/hello_allreduce.cpp" -o "$tmp/hello_os" -s -pthread
"$CXX" -std=c++17 -Os -fno-exceptions -fno-rtti "${defs[@]}" "${inc[@]}" "$root/samples/hello_allreduce.cpp" \
  -o "$tmp/hello_os_noexc" -s -pthread
# Without exceptions the unwind tables (.eh_frame and its index, ~47 KiB here) serve only
# backtraces and debuggers without debug info; firmware builds drop them.
"$CXX" -std=c++17 -Os -fno-exceptions -fno-rtti -fno-asynchronous-unwind-tables "${defs[@]}" "${inc[@]}" \
  "$root/samples/hello_allreduce.cpp" -o "$tmp/hello_os_nounwind" -s -pthread
# KiB with one decimal (a figure at 299.5 must not print as 300, nor 300.4 as 300)
kib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f", b / 1024 }'; }

# 3. memory at rest ---------------------------------------------------------------------
cat > "$tmp/rest.cpp" <<'EOF'
// One allreduce, then each rank reports its own VmRSS and Pss in KiB.
#include <cclite/cclite.hpp>
#include <cstdio>
#include <cstring>
static long field(const char* file, const char* key) {
  std::FILE* f = std::fopen(file, "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, std::strlen(key)) == 0) v = std::atol(line + std::strlen(key));
  std::fclose(f);
  return v;
}
int main() {
  auto comm = cclite::init();
  if (!comm) { std::fprintf(stderr, "%s\n", comm.error().to_string().c_str()); return 1; }
  float x = 1;
  if (!comm.value()->allreduce(&x, 1).ok()) return 1;
  long rss = field("/proc/self/status", "VmRSS:"), pss = field("/proc/self/smaps_rollup", "Pss:");
  if (!comm.value()->barrier().ok()) return 1;  // both ranks measured with everything still mapped
  std::printf("%d %ld %ld\n", comm.value()->rank(), rss, pss);
  return comm.value()->barrier().ok() ? 0 : 1;
}
EOF
"$CXX" -std=c++17 -O2 "${defs[@]}" "${inc[@]}" "$tmp/rest.cpp" -o "$tmp/rest" -pthread

port=$((20000 + RANDOM % 20000))
# prints "rss0/pss0 rss1/pss1" (KiB) for one 2-rank run with extra env "$@"
rest() {
  port=$((port + 1))
  local out
  out=$( (env "$@" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CCLITE_TIMEOUT=60 "$tmp/rest" &
          env "$@" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CCLITE_TIMEOUT=60 "$tmp/rest"; wait) | sort)
  echo "$out" | awk '{printf "%s/%s ", $2, $3}'
}
small=(CCLITE_SHM_BUFFSIZE=65536 CCLITE_TCP_BUFFSIZE=16384 CCLITE_NSOCKS=1 CCLITE_CHUNKSIZE=4096 CCLITE_TCP_BLOCK=4096)
m_shm=$(rest CCLITE_DEBUG=WARN)
m_tcp=$(rest CCLITE_SHM_DISABLE=1)
m_shm_small=$(rest "${small[@]}")
m_tcp_small=$(rest CCLITE_SHM_DISABLE=1 "${small[@]}")

echo "cclite footprint ($("$CXX" --version | head -1); $(nproc) cores; load $(cut -d' ' -f1 /proc/loadavg))"
printf '%-58s %s\n' "what" "figure"
printf '%-58s %s s wall, %s s user\n' "compile hello_allreduce.cpp (umbrella, shm+tcp), -O2" "$hw" "$hu"
printf '%-58s %s s wall, %s s user\n' "  ... with CCLITE_SEPARATE_COMPILATION" "$sw" "$su"
printf '%-58s %s s wall, %s s user\n' "  ... and once per program: cclite_src.cpp" "$cw" "$cu"
printf '%-58s %s s wall, %s s user\n' "compile edge_sensor_average.cpp (tcp only), -O2" "$ew" "$eu"
printf '%-58s %s KiB\n' "hello_allreduce stripped, -static-libstdc++" "$(kib "$tmp/hello_static")"
printf '%-58s %s KiB\n' "hello_allreduce stripped, dynamic" "$(kib "$tmp/hello_dyn")"
printf '%-58s %s KiB\n' "  ... separately compiled, --gc-sections, dynamic" "$(kib "$tmp/hello_sep_dyn")"
printf '%-58s %s KiB\n' "edge_sensor_average stripped, -static-libstdc++" "$(kib "$tmp/edge_static")"
printf '%-58s %s KiB\n' "edge_sensor_average stripped, dynamic" "$(kib "$tmp/edge_dyn")"
printf '%-58s %s KiB\n' "hello_allreduce stripped, -Os, dynamic" "$(kib "$tmp/hello_os")"
printf '%-58s %s KiB\n' "  ... -Os -fno-exceptions -fno-rtti, dynamic" "$(kib "$tmp/hello_os_noexc")"
printf '%-58s %s KiB\n' "  ... and -fno-asynchronous-unwind-tables, dynamic" "$(kib "$tmp/hello_os_nounwind")"
printf '%-58s %s\n' "2 ranks at rest, VmRSS/Pss KiB (rank 0, rank 1):" ""
printf '%-58s %s\n' "  shm, default buffers (4M FIFOs)" "$m_shm"
printf '%-58s %s\n' "  tcp, default buffers (4M rings, 2 sockets)" "$m_tcp"
printf '%-58s %s\n' "  shm, smallest buffers" "$m_shm_small"
printf '%-58s %s\n' "  tcp, smallest buffers" "$m_tcp_small"
printf '%s\n' "where hello_allreduce's -O2 code goes (functions in hello.o, by part):"
where "$tmp/hello.o" | sed 's/^/  /'
