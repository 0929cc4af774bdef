#!/usr/bin/env bash
# bench/compare_all.sh - every collective beside Open MPI's, over shm and over tcp,
# in one run, and one table of the ratios (README "Performance" at a glance).
#
#   bench/compare_all.sh [-r RUNS] [-p] [-m] [-k DIR] [-C "allreduce broadcast ..."]
#                        [-T "shm tcp"] [BUILD_DIR]
#
# Runs bench/compare.sh -C <collective> <transport> for each pair (2 ranks on this
# node; tcp: CCLITE_SHM_DISABLE=1 against Open MPI's btl tcp,self), keeps each
# pair's JSON lines in DIR/<collective>-<transport>/ (-k; default a temporary
# directory, removed) and prints, per pair, the median over RUNS (default 3) of:
#   - cclite's busbw / Open MPI's at each size of BW_ARGS (> 1: cclite faster),
#   - cclite's busbw at the largest size as a share of the machine's limit measured
#     in the same pair's run (1-thread memcpy for shm, loopback tcp per direction with
#     both busy for tcp: compare.sh's "% limit"),
#   - the small call: cclite's time per call in us and cclite / Open MPI's time
#     (< 1: cclite faster).
# Each pair's full tables (every size, [min..max]) are compare.sh's output, kept in
# DIR/<collective>-<transport>.md.
#
# Environment: BW_ARGS (default compare.sh's: 64 KiB to 4 MiB with 200 timed calls
# after 50 warm-up calls, 16 and 64 MiB with 20 after 5; fewer calls for the first
# sizes measured warm-up: over tcp, in a quiet minute, a 64 KiB allreduce took 86 us
# per call at -n 50 -w 10 and 46 us at -n 500 -w 50, Session 41), LAT_ARGS (default "-b 8 -e 8 -n
# 2000 -w 200"), passed on to compare.sh with its other variables (COMMON_ARGS,
# MPIRUN_ARGS, ...). -p as in compare.sh
# (root: every program at autogroup nice -20); -m as in compare.sh (Open MPI
# also with glibc's malloc tuned; the better of its two medians counts).
# The 22 pairs at -r 3 -m took 17 minutes on the 2-vCPU development VM.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
runs=3
prio=()
tuned=()
keep=""
colls="allreduce broadcast reduce allgather reduce_scatter alltoall sendrecv gather scatter scan exscan"
transports="shm tcp"
usage() { sed -n '2,33p' "$0" >&2; exit 2; }
while getopts "r:pmk:C:T:h" opt; do
  case $opt in
    r) runs=$OPTARG ;;
    p) prio=(-p) ;;
    m) tuned=(-m) ;;
    k) keep=$OPTARG ;;
    C) colls=$OPTARG ;;
    T) transports=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-build}
export BW_ARGS=${BW_ARGS:-"-b 64K -e 4M -f 4 -n 200 -w 50; -b 16M -e 64M -f 4"}
export LAT_ARGS=${LAT_ARGS:-"-b 8 -e 8 -n 2000 -w 200"}

if [ -n "$keep" ]; then
  out=$keep
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

started=$(date -u +%Y-%m-%dT%H:%MZ)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for t in $transports; do
  for c in $colls; do
    echo "compare_all.sh: $c over $t" >&2
    # compare.sh checks its arguments and exits non-zero on a failed program
    # (its log tail on stderr); the table then says "failed" for that pair,
    # whatever runs finished before.
    rm -f "$out/$c-$t.failed"
    if ! bash "$here/compare.sh" -r "$runs" "${prio[@]}" "${tuned[@]}" -k "$out/$c-$t" -C "$c" "$t" "$build" \
      > "$out/$c-$t.md"; then
      echo "compare_all.sh: $c over $t failed" >&2
      touch "$out/$c-$t.failed"
    fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$out" "$runs" "$started" "$load_before" "$load_after" "$colls" "$transports" <<'PY'
import json, os, statistics, sys
out, runs, started, lb, la = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
colls, transports = sys.argv[6].split(), sys.argv[7].split()

def load(d, name):
    p = os.path.join(d, name)
    return [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []

def med(rows, coll, field):
    # per size, the median over the runs, out of place
    d = {}
    for r in rows:
        if r.get("inplace", 0) == 0 and r.get("collective") == coll:
            d.setdefault(r["size"], []).append(r[field])
    return {s: statistics.median(v) for s, v in d.items()}

def human(b):
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d%s" % (b // k, unit)
    return "%d B" % b

sizes, rows, wrong = set(), [], 0
for t in transports:
    for c in colls:
        d = os.path.join(out, "%s-%s" % (c, t))
        if os.path.exists(d + ".failed") or not os.path.exists(os.path.join(d, "cclite-%s-bw.json" % t)):
            rows.append((c, t, None))
            continue
        for f in os.listdir(d):
            if f.endswith(".json") and f != "limits.json":
                wrong += sum(r.get("wrong", 0) for r in load(d, f))
        cb = med(load(d, "cclite-%s-bw.json" % t), c, "busbw")
        mb = med(load(d, "mpi-%s-bw.json" % t), c, "busbw")
        cl = med(load(d, "cclite-%s-lat.json" % t), c, "time_us")
        ml = med(load(d, "mpi-%s-lat.json" % t), c, "time_us")
        # -m: Open MPI's better median of as-is and malloc-tuned
        for s, v in med(load(d, "mpi-tuned-%s-bw.json" % t), c, "busbw").items():
            mb[s] = max(mb.get(s, 0), v)
        for s, v in med(load(d, "mpi-tuned-%s-lat.json" % t), c, "time_us").items():
            ml[s] = min(ml.get(s, v), v)
        limits = {r["test"]: r["gbps"] for r in load(d, "limits.json")}
        limit = limits.get("memcpy" if t == "shm" else "tcp_bidir")
        sizes |= set(cb)
        rows.append((c, t, (cb, mb, cl, ml, limit)))
sizes = sorted(sizes)

print("# every collective beside Open MPI, 2 ranks on one node, float sum, out of place;")
print("# median of %d runs; %s, load average before %s, after %s" % (runs, started, lb, la))
print("# BW_ARGS: %s; LAT_ARGS: %s" % (os.environ.get("BW_ARGS"), os.environ.get("LAT_ARGS")))
print()
print("busbw, cclite / Open MPI (> 1: cclite faster); at the largest size also cclite's")
print("busbw as % of the limit (shm: 1-thread memcpy, tcp: loopback per direction);")
print("small call: cclite's time per call and cclite / Open MPI (< 1: cclite faster)")
print()
big = sizes[-1] if sizes else 0
print("| collective | transport | " + " | ".join(human(s) for s in sizes) +
      " | %s, %% limit | small call |" % human(big))
print("|---|---|" + "---:|" * len(sizes) + "---:|---:|")
for c, t, v in rows:
    if v is None:
        print("| %s | %s | failed: compare.sh said why on stderr |" % (c, t))
        continue
    cb, mb, cl, ml, limit = v
    cells = []
    for s in sizes:
        cells.append("%.2f" % (cb[s] / mb[s]) if s in cb and mb.get(s) else "-")
    pct = "%.0f %%" % (100 * cb[big] / limit) if big in cb and limit else "-"
    small = "-"
    if cl:
        s0 = min(cl)
        small = "%s: %.1f us" % (human(s0), cl[s0])
        if ml.get(s0):
            small += ", %.2f" % (cl[s0] / ml[s0])
    print("| %s | %s | %s | %s | %s |" % (c, t, " | ".join(cells), pct, small))
if wrong:
    print("\n# WARNING: %d wrong elements reported: see the per-pair tables" % wrong)
PY
