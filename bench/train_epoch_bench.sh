#!/bin/sh
# bench/train_epoch_bench.sh - epoch time of train_fashion_mnist on 1 rank vs 2 ranks
# with the same global batch, one compute thread per rank, and the bucket timeline
# that shows allreduces starting before backward ends.
#
#   bench/train_epoch_bench.sh                 # batches 64 128 256, 3 runs each
#   bench/train_epoch_bench.sh -b 64 -r 5 -f 256 build
#
# Options: -b "B1 B2 ..." global batches (default "64 128 256"); -r runs per
# configuration (default 3); -e epochs per run (default 3); -f first bucket cap
# in KiB (default 256: the last two layers' gradients go in a bucket of their
# own, reduced while the first layer's backward runs); -o optimizer (default
# sgd); -p: run every job in a session of its own at autogroup nice -20 (root
# only; for a machine where other sessions' builds compete: Linux shares the
# CPUs between sessions first, so a 2-rank job would otherwise get about one
# core's worth); last argument: the build directory (default build).
#
# Per run, the epoch time is the median over its epochs (training only: no
# evaluation, no checkpoint); the table shows the median over the runs, which
# are interleaved (1 rank, 2 ranks, 1 rank, ...) so that load from other
# programs on the machine hits both alike. Needs dataset-fashion-mnist.
set -eu
batches="64 128 256"
runs=3
epochs=3
first_kb=256
optimizer=sgd
prio=""
while getopts "b:r:e:f:o:p" opt; do
  case $opt in
    b) batches=$OPTARG ;;
    r) runs=$OPTARG ;;
    e) epochs=$OPTARG ;;
    f) first_kb=$OPTARG ;;
    o) optimizer=$OPTARG ;;
    p) prio=1 ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-build}
bin=$build/bin
[ -x "$bin/train_fashion_mnist" ] || { echo "no $bin/train_fashion_mnist: build first (cmake --build $build)" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# One run: prints "<median epoch s> <median synchronize s>".
launch() {
  if [ -n "$prio" ]; then
    setsid sh -c 'echo -20 > /proc/$$/autogroup; exec "$@"' sh "$@"
  else
    "$@"
  fi
}

run_once() {  # ranks batch
  launch "$bin/cclite-run" --nproc-per-node "$1" "$bin/train_fashion_mnist" --epochs "$epochs" --batch "$2" \
    --threads 1 --optimizer "$optimizer" --first-bucket-kb "$first_kb" --no-eval --no-checkpoint \
    --progress none > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
  e=$(grep -o 'epoch [0-9]*/[0-9]*: [0-9.]* s' "$tmp/out" | awk '{ print $3 }' | median)
  s=$(grep -o '([0-9.]* s in synchronize)' "$tmp/out" | tr -d '(' | awk '{ print $1 }' | median)
  echo "$e $s"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# train_fashion_mnist epoch time, MLP 784-256-128-10, $optimizer, 1 compute thread per rank,"
echo "# first bucket cap ${first_kb} KiB, $runs interleaved runs x $epochs epochs; $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)${prio:+, autogroup nice -20}"
printf "# %6s %12s %12s %8s %14s   %s\n" "batch" "1 rank (s)" "2 ranks (s)" "ratio" "2r sync (s)" "raw: 1 rank | 2 ranks"
for b in $batches; do
  one="" two="" sync=""
  i=0
  while [ "$i" -lt "$runs" ]; do
    r1=$(run_once 1 "$b")
    r2=$(run_once 2 "$b")
    one="$one ${r1% *}"
    two="$two ${r2% *}"
    sync="$sync ${r2#* }"
    i=$((i + 1))
  done
  m1=$(echo "$one" | tr ' ' '\n' | grep . | median)
  m2=$(echo "$two" | tr ' ' '\n' | grep . | median)
  ms=$(echo "$sync" | tr ' ' '\n' | grep . | median)
  ratio=$(awk -v a="$m1" -v b="$m2" 'BEGIN { printf "%.2f", b / a }')
  printf "  %6s %12s %12s %8s %14s   %s |%s\n" "$b" "$m1" "$m2" "$ratio" "$ms" "$one" "$two"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "# overlap: bucket timeline of the first steps of epoch 2, 2 ranks, batch ${batches%% *} (rank 0)"
launch "$bin/cclite-run" --nproc-per-node 2 "$bin/train_fashion_mnist" --epochs 2 --batch "${batches%% *}" --threads 1 \
  --optimizer "$optimizer" --first-bucket-kb "$first_kb" --no-eval --no-checkpoint --progress none --timeline 4 2>&1 |
  grep -E 'buckets:|timeline epoch 2' || true
