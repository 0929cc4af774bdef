#!/usr/bin/env bash
# bench/algorithms.sh - allreduce busbw of every algorithm, side by side, and
# the selector's automatic choice, at 2 and 4 ranks on this node.
#
#   bench/algorithms.sh                 # shm, 2 and 4 ranks, 3 runs
#   bench/algorithms.sh -r 5 -n "2 4 8" tcp build-release
#
# Options: -r runs (median shown), -n "rank counts"; arguments: shm|tcp|mixed
# (mixed: two fake nodes via CCLITE_HOSTID, shm inside, tcp across), then the
# build directory (default build). Sizes: 8 B (time in us, lower is better),
# 64 KiB, 1 MiB, 64 MiB (busbw in GB/s, nccl-tests definition). The "auto"
# row runs with CCLITE_ALGO unset; the column "pick" names what the selector
# chose for that size (from CCLITE_DEBUG=INFO), so a row can be compared with
# the fastest forced one. No assertion: figures only (DESIGN.md).
set -euo pipefail
runs=3
ranks="2 4"
while getopts "r:n:h" opt; do
  case $opt in
    r) runs=$OPTARG ;;
    n) ranks=$OPTARG ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
mode=${1:-shm}
build=${2:-build}
bin=$build/bin
for p in cclite-run allreduce_perf; do
  [ -x "$bin/$p" ] || { echo "algorithms.sh: no $bin/$p: build first" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_one() {  # ranks algo size -> prints "value pick" (us for 8 B, GB/s otherwise)
  local n=$1 algo=$2 size=$3 iters=20
  [ "$size" = 8 ] && iters=500
  [ "$size" = 64M ] && iters=5
  local env=(CCLITE_DEBUG=INFO)
  [ "$algo" != auto ] && env+=(CCLITE_ALGO="allreduce:$algo")
  [ "$mode" = tcp ] && env+=(CCLITE_SHM_DISABLE=1)
  local launcher=("$bin/cclite-run" --nproc-per-node "$n")
  if [ "$mode" = mixed ]; then
    # Two fake nodes: ranks below n/2 on node a. The worker wrapper sets the id.
    env+=(CCLITE_FAKE_SPLIT=$((n / 2)))
    launcher+=(bash -c 'if [ "$LOCAL_RANK" -lt "$CCLITE_FAKE_SPLIT" ]; then export CCLITE_HOSTID=node-a; else export CCLITE_HOSTID=node-b; fi; exec "$0" "$@"')
  fi
  env "${env[@]}" timeout 600 "${launcher[@]}" "$bin/allreduce_perf" -b "$size" -e "$size" -n "$iters" -w 3 \
    -d float -o sum -J "$tmp/j" >"$tmp/out" 2>"$tmp/err" || { echo "- fail"; return; }
  local bytes pick
  bytes=$(python3 -c 'import sys; s=sys.argv[1]; m={"K":1<<10,"M":1<<20}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))' "$size")
  # The INFO line of this size's call: "allreduce: <bytes> bytes ...: algorithm <name>"
  pick=$(grep -o "allreduce: $bytes bytes.*algorithm [a-z-]*" "$tmp/err" | head -1 | sed 's/.*algorithm //')
  case $pick in
    recursive) pick=rd ;; double) pick=tree ;; halving-doubling) pick=rhd ;; hierarchical) pick=hier ;; shm-direct) pick=direct ;;
  esac
  python3 - "$tmp/j" "$size" "$pick" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = [x for x in rows if x["inplace"] == 0][-1]
v = r["time_us"] if sys.argv[2] == "8" else r["busbw"]
print(f"{v:.2f}", sys.argv[3] or "-")
EOF
  rm -f "$tmp/j"
}

median() { python3 -c 'import sys,statistics as s; v=[float(x) for x in sys.argv[1:] if x!="-"]; print(f"{s.median(v):.2f}" if v else "-")' "$@"; }

echo "# allreduce per algorithm, $mode, medians of $runs runs (8 B: us; others: busbw GB/s)"
for n in $ranks; do
  printf '\n%-6s %-6s %10s %10s %10s %10s   %s\n' ranks algo 8B 64K 1M 64M "auto's pick per size"
  for algo in ${ALGOS:-auto ring tree rd rhd hier direct}; do
    line=$(printf '%-6s %-6s' "$n" "$algo")
    picks=""
    for size in 8 64K 1M 64M; do
      vals=()
      for ((i = 0; i < runs; i++)); do
        read -r v p < <(run_one "$n" "$algo" "$size")
        vals+=("$v")
      done
      line+=$(printf ' %10s' "$(median "${vals[@]}")")
      picks+="$size:$p "
    done
    [ "$algo" = auto ] && line+="   $picks"
    echo "$line"
  done
done
