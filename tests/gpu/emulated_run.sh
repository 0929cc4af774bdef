#!/usr/bin/env bash
# tests/gpu/emulated_run.sh WORD COMMAND... - a GPU program built against the
# emulated CUDA runtime (emulated_cudart.cpp), run end to end by ctest, once on
# each native path: CUDA IPC (the default inside a node) and host staging
# (CCLITE_CUDA_IPC=0). Each run must exit 0 and print WORD on every rank; the
# "no CUDA device" exit (77) is a failure here, since the emulation has a device.
# Also runs hello_allreduce_nvcc (the CPU sample compiled by nvcc), where
# CCLITE_CUDA_IPC changes nothing: it checks the program twice.
set -u
word=$1
shift
fail=0
for ipc in 1 0; do
  out=$(CCLITE_CUDA_IPC=$ipc timeout 120 "$@" 2>&1)
  rc=$?
  echo "$out"
  hits=$(grep -c -- "$word" <<<"$out")
  if [ $rc -ne 0 ]; then
    echo "FAIL: CCLITE_CUDA_IPC=$ipc: exit status $rc"; fail=1
  elif [ "$hits" -lt 2 ]; then
    echo "FAIL: CCLITE_CUDA_IPC=$ipc: '$word' printed by $hits rank(s), not 2"; fail=1
  else
    echo "ok: CCLITE_CUDA_IPC=$ipc"
  fi
done
exit $fail
