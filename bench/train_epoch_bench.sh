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
# in KiB (default: the sample's, i.e. one bucket when the ranks use every
# core, as here; 256: the last two layers' gradients in a bucket of their own,
# reduced while the first layer's backward runs; the timeline at the end
# always uses 256 unless -f is given, to show that overlap); -s split size in KiB
# (default 0: one bucket for all of fc1; 196: fc1's weight gradient in 4 row
# blocks with a bucket each); -o optimizer (default
# sgd); -p: run every job in a session of its own at autogroup nice -20 (root
# only; for a machine where other sessions' builds compete: Linux shares the
# CPUs between sessions first, so a 2-rank job would otherwise get about one
# core's worth); last argument: the build directory (default build).
#
# Per run, the epoch time is the median over its epochs (training only: no
# evaluation, no checkpoint); the table shows the median over the runs, which
# are interleaved (1 rank, 2 ranks, 1 rank, ...) so that load from other
# programs on the machine hits both alike. "step-med": the median step time
# (--profile) times the steps of an epoch, and "p10": the fastest tenth's
# step time times the steps; both leave out steps that other programs' load
# stretched, p10 nearly all of them (a busy machine's estimate of a quiet one).
# TRAIN_ARGS (environment) is appended to every train_fashion_mnist command,
# e.g. TRAIN_ARGS="--shared-grads 0" for gradients in ordinary memory.
# Needs dataset-fashion-mnist.
set -eu
batches="64 128 256"
runs=3
epochs=3
first_kb=""
split_kb=0
optimizer=sgd
prio=""
while getopts "b:r:e:f:s:o:p" opt; do
  case $opt in
    b) batches=$OPTARG ;;
    r) runs=$OPTARG ;;
    e) epochs=$OPTARG ;;
    f) first_kb=$OPTARG ;;
    s) split_kb=$OPTARG ;;
    o) optimizer=$OPTARG ;;
    p) prio=1 ;;
    *) sed -n '2,31p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-build}
bin=$build/bin
[ -x "$bin/train_fashion_mnist" ] || { echo "no $bin/train_fashion_mnist: build first (cmake --build $build)" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# One run: prints "<median epoch s> <median synchronize s> <step-median epoch s> <p10 epoch s>".
launch() {
  if [ -n "$prio" ]; then
    setsid sh -c 'echo -20 > /proc/$$/autogroup; exec "$@"' sh "$@"
  else
    "$@"
  fi
}

run_once() {  # ranks batch
  launch "$bin/cclite-run" --nproc-per-node "$1" "$bin/train_fashion_mnist" --epochs "$epochs" --batch "$2" \
    --threads 1 --optimizer "$optimizer" ${first_kb:+--first-bucket-kb "$first_kb"} --split-kb "$split_kb" --no-eval --no-checkpoint \
    --progress none --profile ${TRAIN_ARGS:-} > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
  e=$(grep -o 'epoch [0-9]*/[0-9]*: [0-9.]* s' "$tmp/out" | awk '{ print $3 }' | median)
  s=$(grep -o '([0-9.]* s in synchronize)' "$tmp/out" | tr -d '(' | awk '{ print $1 }' | median)
  [ -n "$s" ] || s=0
  m=$(grep -o 'steps = [0-9.]* s' "$tmp/out" | awk '{ print $3 }' | median)
  q=$(grep -o 'p10 [0-9.]* us ([0-9.]* s)' "$tmp/out" | tr -d '(' | awk '{ print $4 }' | median)
  echo "$e $s $m $q"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# train_fashion_mnist epoch time, MLP 784-256-128-10, $optimizer, 1 compute thread per rank,"
echo "# first bucket cap ${first_kb:-auto} KiB, split ${split_kb} KiB, $runs interleaved runs x $epochs epochs; $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)${prio:+, autogroup nice -20}"
printf "# %6s %11s %11s %6s %11s %11s %6s %8s %8s %6s %12s   %s\n" "batch" "1 rank (s)" "2 ranks (s)" "ratio" \
  "1r step-med" "2r step-med" "ratio" "1r p10" "2r p10" "ratio" "2r sync (s)" "raw epoch s: 1 rank | 2 ranks"
col() { echo "$1" | tr ' ' '\n' | grep . | median; }
for b in $batches; do
  one="" two="" sync="" one_m="" two_m="" one_q="" two_q=""
  i=0
  while [ "$i" -lt "$runs" ]; do
    set -- $(run_once 1 "$b")
    one="$one $1" one_m="$one_m $3" one_q="$one_q $4"
    set -- $(run_once 2 "$b")
    two="$two $1" sync="$sync $2" two_m="$two_m $3" two_q="$two_q $4"
    i=$((i + 1))
  done
  m1=$(col "$one") m2=$(col "$two") ms=$(col "$sync") p1=$(col "$one_m") p2=$(col "$two_m") q1=$(col "$one_q") q2=$(col "$two_q")
  ratio=$(awk -v a="$m1" -v b="$m2" 'BEGIN { printf "%.2f", b / a }')
  pratio=$(awk -v a="$p1" -v b="$p2" 'BEGIN { printf "%.2f", b / a }')
  qratio=$(awk -v a="$q1" -v b="$q2" 'BEGIN { printf "%.2f", b / a }')
  printf "  %6s %11s %11s %6s %11s %11s %6s %8s %8s %6s %12s   %s |%s\n" "$b" "$m1" "$m2" "$ratio" "$p1" "$p2" "$pratio" \
    "$q1" "$q2" "$qratio" "$ms" "$one" "$two"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "# overlap: bucket timeline of the first steps of epoch 2, 2 ranks, batch ${batches%% *} (rank 0)"
launch "$bin/cclite-run" --nproc-per-node 2 "$bin/train_fashion_mnist" --epochs 2 --batch "${batches%% *}" --threads 1 \
  --optimizer "$optimizer" --first-bucket-kb "${first_kb:-256}" --split-kb "$split_kb" --shard-optimizer 0 --no-eval --no-checkpoint --progress none --timeline 4 2>&1 |
  grep -E 'buckets:|timeline epoch 2' || true
