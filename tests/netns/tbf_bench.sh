#!/bin/sh
# tests/netns/tbf_bench.sh - allreduce between 2 simulated nodes over a
# rate-limited link, against that link's bound. A benchmark, not a test: it
# prints the figure and exits 0 whenever the run itself worked.
#
#   tests/netns/tbf_bench.sh [RATE] [SIZE]     (root; defaults 10gbit 256M)
#   CCLITE_BIN_DIR=build/bin by default; extra allreduce_perf flags in PERF_FLAGS
#
# Each node's eth0 egress goes through `tc qdisc ... tbf rate RATE` (tbf is in
# every kernel; netem is not). One rank per node, so every byte crosses the
# link: a 2-rank ring allreduce sends S bytes each way, busbw = algbw, and its
# bound is the link rate (10 Gbit/s = 1.25 GB/s). The nodes share this
# machine's CPUs, so on a small VM the CPU (copies, loopback veth, reduction)
# may bind before the link does; the script prints the unlimited figure too.
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/nodes.sh"
RATE=${1:-10gbit}
SIZE=${2:-256M}
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)

nodes_require
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/cclite-tbf.XXXXXX")
[ -x "$BIN/allreduce_perf" ] || { echo "build allreduce_perf and cclite-run first ($BIN)"; exit 1; }

# GB/s of RATE ("10gbit", "1gbit", "500mbit").
bound=$(echo "$RATE" | awk '{ r = $1; u = r; sub(/[0-9.]+/, "", u); v = r + 0;
  m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1;
  printf "%.3f", v * m / 8 / 1e9 }')

run_once() {  # $1: label
  i=0
  while [ "$i" -lt 2 ]; do
    node_run "$i" "$LOGS/$1-node$i.log" env CCLITE_TIMEOUT=600 "$BIN/cclite-run" --nnodes 2 \
      --rdzv-id "tbf$$" --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --timeout 600 \
      "$BIN/allreduce_perf" -b "$SIZE" -e "$SIZE" -n 5 -w 2 $PERF_FLAGS
    i=$((i + 1))
  done
  node_wait 0 660
  node_wait 1 60
  if [ "$NODE_RC_0" != 0 ] || [ "$NODE_RC_1" != 0 ]; then
    echo "run '$1' failed (exit $NODE_RC_0 / $NODE_RC_1):"
    cat "$LOGS/$1-node0.log" "$LOGS/$1-node1.log"
    exit 1
  fi
  # rank 0's data row: size count type redop time algbw busbw #wrong ...
  grep '^\[rank 0\]: *[0-9]' "$LOGS/$1-node0.log" | tail -1 | sed 's/^\[rank 0\]: *//'
}

nodes_up 2
echo "# 2 nodes x 1 rank, allreduce $SIZE float sum, cclite tcp over veth + bridge"
echo "# columns: size count type redop | out-of-place time(us) algbw busbw #wrong | in-place ..."
unlimited=$(run_once unlimited)
echo "unlimited link:  $unlimited"
nodes_rate "$RATE"
limited=$(run_once tbf)
echo "tbf $RATE link: $limited"
busbw=$(echo "$limited" | awk '{ print $7 }')
echo "$busbw $bound $RATE" | awk '{ printf "busbw %.3f GB/s = %.0f%% of the %s link bound (%.3f GB/s)\n", $1, 100 * $1 / $2, $3, $2 }'
rm -rf "$LOGS"
