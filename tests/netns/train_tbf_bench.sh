#!/bin/sh
# tests/netns/train_tbf_bench.sh - the sample trainer on 2 simulated nodes over
# a rate-limited link, with its gradients sent as fp32, bf16 and fp16
# (train_fashion_mnist --compress). A benchmark, not a test: it prints the
# figures and exits 0 whenever the runs worked.
#
#   tests/netns/train_tbf_bench.sh [RATE] [ROUNDS]     (root; defaults 1gbit 3)
#   CCLITE_BIN_DIR=build/bin by default; TRAIN_ARGS adds trainer flags;
#   MODES="none bf16 fp16" by default; PRIO=0: not at autogroup nice -20.
#
# One rank per node, so every gradient byte crosses the link: a 2-rank ring
# allreduce sends the 918.5 KiB gradient once per step each way, 7.5 ms at
# 1 Gbit/s (3.8 ms in 16 bits). Each run trains 2 epochs of --max-steps 300
# (global batch 64, one compute thread per rank) without evaluation or
# checkpoints; the figure is epoch 2's time. Modes alternate within a round,
# and the medians over the rounds are printed with the link's share of them.
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/nodes.sh"
RATE=${1:-1gbit}
ROUNDS=${2:-3}
MODES=${MODES:-none bf16 fp16}
STEPS=300
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)

nodes_require
[ -x "$BIN/train_fashion_mnist" ] && [ -x "$BIN/cclite-run" ] ||
  { echo "build train_fashion_mnist and cclite-run first ($BIN)"; exit 1; }
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/cclite-train-tbf.XXXXXX")
PRIO=${PRIO:-1}
if [ "$PRIO" = 1 ]; then
  # shellcheck disable=SC2016  # $$ and $@ belong to the inner sh
  set -- setsid -w sh -c 'echo -20 > /proc/$$/autogroup 2>/dev/null; exec "$@"' sh
else
  set --
fi

rate_bps=$(rate_bytes "$RATE")

run_once() {  # $1: mode; the rest: the command prefix. Prints epoch 2's seconds.
  mode=$1
  shift
  i=0
  while [ "$i" -lt 2 ]; do
    node_run "$i" "$LOGS/$mode-node$i.log" "$@" env CCLITE_TIMEOUT=300 OPENBLAS_NUM_THREADS=1 \
      "$BIN/cclite-run" --nnodes 2 --rdzv-id "trtbf$$" --rdzv-endpoint "$(node_addr 0):29400" \
      --rdzv-timeout 60 --timeout 300 "$BIN/train_fashion_mnist" --epochs 2 --max-steps "$STEPS" \
      --threads 1 --no-eval --no-checkpoint --progress none --compress "$mode" $TRAIN_ARGS
    i=$((i + 1))
  done
  node_wait 0 330
  node_wait 1 30
  if [ "$NODE_RC_0" != 0 ] || [ "$NODE_RC_1" != 0 ]; then
    echo "run '$mode' failed (exit $NODE_RC_0 / $NODE_RC_1):" >&2
    cat "$LOGS/$mode-node0.log" "$LOGS/$mode-node1.log" >&2
    exit 1
  fi
  sed -n 's/^\[rank 0\]: epoch 2\/2: \([0-9.]*\) s.*/\1/p' "$LOGS/$mode-node0.log"
}

nodes_up 2
nodes_rate "$RATE"
echo "# train_fashion_mnist, 2 nodes x 1 rank over a tbf $RATE link (veth + bridge), $STEPS steps of batch 64"
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ)$( [ "$PRIO" = 1 ] && echo ', autogroup nice -20')"
r=0
while [ "$r" -lt "$ROUNDS" ]; do
  for m in $MODES; do
    t=$(run_once "$m" "$@") || exit 1
    echo "round $((r + 1)) $m: epoch 2 $t s"
    echo "$t" >>"$LOGS/$m.times"
  done
  r=$((r + 1))
done
# 918.5 KiB of fp32 gradients per step (the sample's 784-256-128-10 MLP).
for m in $MODES; do
  bytes=940544
  [ "$m" = none ] || bytes=470272
  sort -n "$LOGS/$m.times" | awk -v m="$m" -v b="$bytes" -v r="$rate_bps" -v s="$STEPS" '
    { t[NR] = $1 } END { med = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2;
      link = b * s / r;
      printf "%-5s median %.2f s per %d steps (%.2f ms per step); the link alone needs %.2f s (%.0f%%)\n",
             m, med, s, 1000 * med / s, link, 100 * link / med }'
done
rm -rf "$LOGS"
