#!/usr/bin/env bash
# tests/gpu/train_cuda.sh SAMPLE CCLITE_RUN - the GPU trainer sample end to end.
#   No GPU: `SAMPLE --epochs 1` must exit non-zero at once saying "no CUDA device".
#   A GPU:  1 epoch on 2 ranks sharing it (cclite-run --nproc-per-node 2), the
#           final test accuracy must be above 0.8; 77 (skip) without the dataset
#           (FASHION_MNIST_DIR, default /usr/share/datasets/fashion-mnist).
# CCLITE_GPU_BACKEND passes through (auto picks native for 2 ranks on one GPU).
set -u
SAMPLE=$1
RUN=$2
out=$("$SAMPLE" --device-check 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  out=$(timeout 60 "$SAMPLE" --epochs 1 2>&1)
  rc=$?
  echo "$out"
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "no CUDA device" <<<"$out"; then
    echo "RESULT train_cuda no_gpu_clean_exit ok (rc=$rc)"
    exit 0
  fi
  echo "RESULT train_cuda no_gpu_clean_exit FAIL (rc=$rc, expected non-zero and 'no CUDA device')"
  exit 1
fi
DATA=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -e "$DATA/train-images-idx3-ubyte" ]; then
  echo "SKIP train_cuda: no Fashion-MNIST in $DATA (set FASHION_MNIST_DIR)"
  exit 77
fi
out=$(timeout 240 "$RUN" --nproc-per-node 2 "$SAMPLE" --epochs 1 --data "$DATA" 2>&1)
rc=$?
echo "$out"
acc=$(sed -n 's/^.*final test accuracy \([0-9.]*\).*$/\1/p' <<<"$out" | tail -n 1)
if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.8) }'; then
  echo "RESULT train_cuda 2_ranks_1_gpu_1_epoch ok accuracy $acc"
  exit 0
fi
echo "RESULT train_cuda 2_ranks_1_gpu_1_epoch FAIL (rc=$rc, accuracy '${acc:-none}', need > 0.8)"
exit 1
