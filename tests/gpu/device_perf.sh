#!/usr/bin/env bash
# tests/gpu/device_perf.sh PERF CCLITE_RUN [check|sweep|emulated] - bench/device_allreduce_perf end to end.
#   No GPU: it must exit 77 at once, saying "no CUDA device" (the absence, checked
#           on every machine); the script then exits 0 (check) or 77 (sweep).
#   check (ctest): 1 rank, then 2 ranks sharing the GPU on the native engine
#           (CUDA IPC, then staged), small sizes: every #wrong must be 0.
#   emulated (ctest, PERF built against emulated_cudart.cpp): as check, but the
#           "no CUDA device" exit is a failure (the emulation has a device).
#   sweep (tests/gpu/run.sh): 1 MiB - 256 MiB on the same two paths and, with 2 or
#           more GPUs, NCCL on 2 ranks (one GPU each) beside them; prints
#           "RESULT devperf IMPL RANKS BYTES OOP_US OOP_BUSBW IP_BUSBW WRONG" rows.
set -u
PERF=$1
RUN=$2
MODE=${3:-check}
out=$(CCLITE_RANK=0 CCLITE_WORLD_SIZE=1 timeout 60 "$PERF" -b 8 -e 64K -f 8 -n 2 -w 1 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 77 ] && [ "$MODE" != emulated ]; then
  if grep -q "no CUDA device" <<<"$out"; then
    echo "RESULT device_perf no_gpu_clean_exit ok"
    [ "$MODE" = check ] && exit 0 || exit 77
  fi
  echo "RESULT device_perf no_gpu_clean_exit FAIL (exit 77 without 'no CUDA device')"
  exit 1
fi
[ $rc -eq 0 ] || { echo "RESULT device_perf one_rank FAIL (rc=$rc)"; exit 1; }
sizes="-b 8 -e 4M -f 8 -n 5 -w 2"
[ "$MODE" = sweep ] && sizes="-b 1M -e 256M -f 4 -n 20 -w 5"
# One run: its rows as RESULT lines (nccl-tests columns: size count type redop,
# then time algbw busbw #wrong out of place and in place).
sweep() {  # impl ranks flags...
  local impl=$1 ranks=$2; shift 2
  local o
  o=$(timeout 240 "$RUN" --nproc-per-node "$ranks" "$PERF" "$@" $sizes 2>&1)
  local r=$?
  echo "$o"
  # (cclite-run prefixes rank 0's lines with "[rank 0]: ")
  local rows
  rows=$(awk -v impl="$impl" -v n="$ranks" '{ sub(/^\[rank [0-9]+\]: */, "") }
    $1 ~ /^[0-9]+$/ && NF >= 12 { print "RESULT devperf", impl, n, $1, $5, $7, $11, $8 + $12 }' <<<"$o")
  [ -n "$rows" ] && echo "$rows"
  [ $r -eq 0 ] || { echo "RESULT device_perf $impl FAIL (rc=$r)"; return 1; }
  [ -n "$rows" ] || { echo "RESULT device_perf $impl FAIL (no result rows)"; return 1; }
}
fail=0
sweep native-ipc 2 -g native -I 1 || fail=1
sweep native-staged 2 -g native -I 0 || fail=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$MODE" = sweep ] && [ "${gpus:-0}" -ge 2 ]; then
  sweep nccl 2 -g nccl || fail=1
fi
[ $fail = 0 ] && echo "RESULT device_perf ok"
exit $fail
