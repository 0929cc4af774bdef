#!/usr/bin/env bash
# tests/gpu/no_gpu_or_pass.sh COMMAND... - a GPU program run end to end by ctest.
#   A GPU: the command must exit 0.
#   No GPU: it must exit 77 and say "no CUDA device" (the clean absence).
out=$("$@" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] && exit 0
if [ $rc -eq 77 ] && grep -q "no CUDA device" <<<"$out"; then
  echo "no GPU here: clean 'no CUDA device' exit (77), as expected"
  exit 0
fi
echo "FAIL: exit status $rc"
exit 1
