#!/bin/sh
# tests/netns/tbf_bench.sh - allreduce between 2 simulated nodes over a
# rate-limited link, against that link's bound. A benchmark, not a test: it
# prints the figure and exits 0 whenever the run itself worked.
#
#   tests/netns/tbf_bench.sh [RATE] [SIZE]     (root; defaults 10gbit 256M)
#   CCLITE_BIN_DIR=build/bin by default; extra allreduce_perf flags in PERF_FLAGS;
#   PRIO=0: do not run the programs at autogroup nice -20 (default: do, as
#   bench/compare.sh -p; on a shared machine other sessions otherwise take half)
#
# Each node's eth0 egress goes through `tc qdisc ... tbf rate RATE` (tbf is in
# every kernel; netem is not) with a burst of 10 ms at RATE (at least 4 MiB):
# tbf needs at least RATE/HZ (5 MB at 10 Gbit/s and HZ=250), or the qdisc
# itself caps the rate. One rank per node, so every byte crosses the link: a
# 2-rank ring allreduce sends S bytes each way, busbw = algbw, and its bound is
# the link rate (10 Gbit/s = 1.25 GB/s). The nodes share this machine's CPUs,
# so on a small VM the CPU (copies, veth + bridge, reduction) may bind before
# the link does. So the script also measures the practical bound, on the
# unlimited and the limited link: two processes, one per node, streaming to
# each other at the same time over one TCP connection (machine_limits
# tcp_bidir, iperf-like), per direction, and prints busbw against both.
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/nodes.sh"
RATE=${1:-10gbit}
SIZE=${2:-256M}
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)

nodes_require
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/cclite-tbf.XXXXXX")
[ -x "$BIN/allreduce_perf" ] || { echo "build allreduce_perf and cclite-run first ($BIN)"; exit 1; }
PRIO=${PRIO:-1}
# A command prefix: the rest runs in a session of its own at autogroup nice -20.
if [ "$PRIO" = 1 ]; then
  # shellcheck disable=SC2016  # $$ and $@ belong to the inner sh
  set -- setsid -w sh -c 'echo -20 > /proc/$$/autogroup 2>/dev/null; exec "$@"' sh
else
  set --
fi

# GB/s of RATE ("10gbit", "1gbit", "500mbit").
bound=$(rate_bytes "$RATE" | awk '{ printf "%.3f", $1 / 1e9 }')

# Practical bound: machine_limits tcp_bidir between the nodes (listener on
# node 0, the other process in node 1's namespace); prints "GB/s [min..max]".
stream_bound() {
  if [ ! -x "$BIN/machine_limits" ]; then echo "- (no machine_limits)"; return; fi
  ip netns exec "$(node_ns 0)" sh -c 'echo -20 > /proc/$$/autogroup 2>/dev/null; exec "$@"' sh \
    "$BIN/machine_limits" -t tcp_bidir -n 5 -a "$(node_addr 0)" -N "/var/run/netns/$(node_ns 1)" 2>&1 |
    awk '$1 == "tcp_bidir" { printf "%s [%s..%s]", $2, $3, $4; found = 1 } END { if (!found) printf "- (failed)" }'
}

run_once() {  # $1: label; the rest: the command prefix set above
  label=$1
  shift
  i=0
  while [ "$i" -lt 2 ]; do
    node_run "$i" "$LOGS/$label-node$i.log" "$@" env CCLITE_TIMEOUT=600 "$BIN/cclite-run" --nnodes 2 \
      --rdzv-id "tbf$$" --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --timeout 600 \
      "$BIN/allreduce_perf" -b "$SIZE" -e "$SIZE" -n 5 -w 2 $PERF_FLAGS
    i=$((i + 1))
  done
  node_wait 0 660
  node_wait 1 60
  if [ "$NODE_RC_0" != 0 ] || [ "$NODE_RC_1" != 0 ]; then
    echo "run '$label' failed (exit $NODE_RC_0 / $NODE_RC_1):"
    cat "$LOGS/$label-node0.log" "$LOGS/$label-node1.log"
    exit 1
  fi
  # rank 0's data row: size count type redop time algbw busbw #wrong ...
  grep '^\[rank 0\]: *[0-9]' "$LOGS/$label-node0.log" | tail -1 | sed 's/^\[rank 0\]: *//'
}

nodes_up 2
echo "# 2 nodes x 1 rank, allreduce $SIZE float sum, cclite tcp over veth + bridge$( [ "$PRIO" = 1 ] && echo ', autogroup nice -20')"
echo "# columns: size count type redop | out-of-place time(us) algbw busbw #wrong | in-place ..."
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ)"
unlimited=$(run_once unlimited "$@")
echo "unlimited link:  $unlimited"
echo "unlimited link, 2-process TCP stream each way (tcp_bidir, GB/s per direction): $(stream_bound)"
nodes_rate "$RATE"
limited=$(run_once tbf "$@")
echo "tbf $RATE link (burst $NODES_BURST B): $limited"
practical=$(stream_bound)
echo "tbf $RATE link, 2-process TCP stream each way (tcp_bidir, GB/s per direction): $practical"
busbw=$(echo "$limited" | awk '{ print $7 }')
echo "$busbw $bound $RATE" | awk '{ printf "busbw %.3f GB/s = %.0f%% of the %s link bound (%.3f GB/s)\n", $1, 100 * $1 / $2, $3, $2 }'
echo "$busbw ${practical%% *}" | awk '$2 + 0 > 0 { printf "busbw %.3f GB/s = %.0f%% of the practical bound through the same link (%.3f GB/s)\n", $1, 100 * $1 / $2, $2 }'
rm -rf "$LOGS"
