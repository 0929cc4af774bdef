#!/bin/sh
# tests/verbs/run.sh - the verbs transport on a machine that has RDMA: real
# InfiniBand / RoCE NICs, or Soft-RoCE (rdma_rxe) on any Ethernet interface.
#
# The development machines have no RDMA device, so ctest there runs the
# zero-device half of tests/verbs_test.cpp against the real libibverbs, and the
# other half against a stand-in for it (tests/verbs/emulated_ibverbs.cpp:
# verbs_emulated_test, collectives_verbs_emulated). This script runs that half
# on a real device:
#
#   1. verbs_test, whose "verbs hardware:" cases then connect two ranks over
#      RDMA (default settings, then a 64 KiB FIFO on 3 QPs: wraparound, credits);
#   2. the collective test matrix (allreduce_test, collectives_test,
#      collective_test) built with -DCCLITE_DEFAULT_WITH_VERBS=1, so that
#      default_communicator is communicator<shm, verbs, tcp>: their "tcp"
#      configurations (CCLITE_SHM_DISABLE=1) and "mixed" fake nodes then go over
#      verbs, looped back through the local HCA; the log must say "via verbs";
#   3. allreduce_perf_verbs (bench/allreduce_perf.cpp over shm, verbs, tcp) on
#      2 local ranks forced onto verbs, next to the same run over tcp
#      (CCLITE_IB_DISABLE=1), nccl-tests columns.
#
# Usage:  tests/verbs/run.sh [--soft-roce IFACE] [BUILD_DIR]    (default build-verbs-hw)
#   --soft-roce IFACE   first create rxe0 on IFACE (root: modprobe rdma_rxe;
#                       rdma link add rxe0 type rxe netdev IFACE)
# Environment: CCLITE_IB_HCA, CCLITE_IB_GID_INDEX, ... pass through (transports/verbs/README.md).
# Across two nodes, after this script: on every node
#   CCLITE_DEBUG=INFO BUILD_DIR/bin/cclite-run --nnodes 2 --nproc-per-node 1 --rdzv-id 1 \
#     --rdzv-endpoint node0:29400 BUILD_DIR/bin/allreduce_perf_verbs -b 8 -e 256M -f 4
# Exit status: 0 passed, 1 failed, 77 no RDMA device (skipped).
set -eu
cd "$(dirname "$0")/../.."

SOFT_ROCE=""
if [ "${1:-}" = "--soft-roce" ]; then SOFT_ROCE="${2:?--soft-roce needs an interface}"; shift 2; fi
BUILD="${1:-build-verbs-hw}"
JOBS="${JOBS:-$(nproc)}"

if [ -n "$SOFT_ROCE" ]; then
  SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO modprobe rdma_rxe
  rdma link show rxe0 >/dev/null 2>&1 || $SUDO rdma link add rxe0 type rxe netdev "$SOFT_ROCE"
fi

if ! ls /sys/class/infiniband/ 2>/dev/null | grep -q .; then
  echo "verbs/run.sh: no RDMA device (/sys/class/infiniband is empty): skipped."
  echo "  Soft-RoCE on an Ethernet interface: tests/verbs/run.sh --soft-roce eth0"
  echo "  (needs the rdma_rxe kernel module: apt-get install linux-modules-extra-\$(uname -r) rdma-core)"
  exit 77
fi
echo "== RDMA devices"
if command -v ibv_devinfo >/dev/null; then ibv_devinfo | grep -E "hca_id|port:|state|link_layer|active_mtu" || true
else ls /sys/class/infiniband/; fi
# Registered memory is pinned: 2 x CCLITE_IB_BUFFSIZE per peer must fit under it.
echo "locked-memory limit (ulimit -l): $(ulimit -l)"

echo "== build ($BUILD, -DCCLITE_DEFAULT_WITH_VERBS=1)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-DCCLITE_DEFAULT_WITH_VERBS=1 >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target verbs_test allreduce_test collectives_test collective_test \
  allreduce_perf_verbs cclite-run

LOG="$BUILD/verbs-run.log"
: >"$LOG"
status=0

echo "== verbs_test (hardware cases included)"
"$BUILD/bin/verbs_test" || status=1

echo "== collective matrix over verbs (log: $LOG)"
for t in allreduce_test collectives_test collective_test; do
  if CCLITE_DEBUG=INFO "$BUILD/bin/$t" >>"$LOG" 2>&1; then echo "$t: passed"; else echo "$t: FAILED"; status=1; fi
done
via=$(grep -c "via verbs" "$LOG" || true)
echo "peer links that chose verbs: $via"
if [ "$via" -eq 0 ]; then
  echo "verbs was never chosen; the reasons:"; grep "verbs:" "$LOG" | sort | uniq -c | head -20
  status=1
fi

echo "== allreduce_perf_verbs, 2 local ranks over verbs (shm off)"
OUT="$BUILD/verbs-perf.log"
CCLITE_SHM_DISABLE=1 CCLITE_DEBUG=INFO "$BUILD/bin/cclite-run" --nproc-per-node 2 \
  "$BUILD/bin/allreduce_perf_verbs" -b 8 -e 64M -f 4 >"$OUT" 2>&1 || status=1
grep -v " INFO " "$OUT" || true
grep " INFO verbs: using\| via " "$OUT" || true
grep -q " via verbs" "$OUT" || { echo "allreduce_perf_verbs did not use verbs (see $OUT)"; status=1; }
echo "== the same over tcp (CCLITE_IB_DISABLE=1), for comparison"
CCLITE_SHM_DISABLE=1 CCLITE_IB_DISABLE=1 "$BUILD/bin/cclite-run" --nproc-per-node 2 \
  "$BUILD/bin/allreduce_perf_verbs" -b 8 -e 64M -f 4 || status=1

[ "$status" -eq 0 ] && echo "verbs/run.sh: passed" || echo "verbs/run.sh: FAILED"
exit "$status"
