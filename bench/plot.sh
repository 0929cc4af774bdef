#!/usr/bin/env bash
# bench/plot.sh - busbw vs message size, as a PNG, from the perf programs' -J JSON lines.
#
#   bench/plot.sh out.png cclite.json mpi.json
#   bench/plot.sh out.png ring=ring.json tree=tree.json limits.json
#   TITLE="allreduce, 2 ranks, shm" bench/plot.sh docs/allreduce_shm.png a.json b.json
#
# One line per implementation ("impl" of each JSON line: cclite, mpi, ...) and
# collective. Name a file LABEL=file.json to label its lines yourself, e.g. one file
# per algorithm (CCLITE_ALGO / coll_perf -a); files given the same LABEL merge into
# one line; unlabelled files whose lines would share a label get the file's name
# added. Each point is the median busbw over every line of that size (append
# several runs to one -J file to get medians).
# machine_limits -J lines draw as dashed horizontal lines, for the tests named in
# LIMITS (default "memcpy,tcp_bidir"; LIMITS= for none).
# Environment: TITLE, INPLACE (0 = out-of-place columns, the default; 1 = in-place),
# LOGY=1 (log y axis), SIZE (gnuplot "W,H" in pixels, default 800,480).
# Needs python3 and gnuplot (Debian: gnuplot-nox; scripts/install-bench-deps.sh).
set -euo pipefail

if [ $# -lt 2 ]; then sed -n '2,19p' "$0" >&2; exit 2; fi
command -v gnuplot > /dev/null || { echo "plot.sh: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 2; }
command -v python3 > /dev/null || { echo "plot.sh: needs python3" >&2; exit 2; }
png=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# python3 writes one data file per line of the plot and the gnuplot script.
TITLE=${TITLE:-} INPLACE=${INPLACE:-0} LOGY=${LOGY:-0} SIZE=${SIZE:-800,480} \
LIMITS=${LIMITS-memcpy,tcp_bidir} python3 - "$tmp" "$png" "$@" > "$tmp/plot.gp" <<'PY'
import json, os, statistics, sys

tmp, png, args = sys.argv[1], sys.argv[2], sys.argv[3:]
inplace = int(os.environ["INPLACE"])
limits_wanted = [t for t in os.environ["LIMITS"].split(",") if t]

series = {}   # (file index, label, impl, collective) -> {size: [busbw]}
limits = {}   # test -> [gbps]
meta = set()
for i, arg in enumerate(args):
    label, path = (arg.split("=", 1) if "=" in arg and not os.path.exists(arg) else (None, arg))
    if not os.path.exists(path):
        sys.exit("plot.sh: no such file: %s" % path)
    for n, line in enumerate(open(path), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            sys.exit("plot.sh: %s:%d: not a JSON line" % (path, n))
        if r.get("impl") == "machine":
            limits.setdefault(r["test"], []).append(r["gbps"])
            continue
        if "busbw" not in r or r.get("inplace", 0) != inplace:
            continue
        # Files given the same LABEL= merge into one line; unlabelled files stay apart.
        key = (-1 if label else i, label, r.get("impl", "?"), r.get("collective", "?"),
               "" if label else path)
        series.setdefault(key, {}).setdefault(r["size"], []).append(r["busbw"])
        meta.add((r.get("collective"), r.get("ranks"), r.get("type"), r.get("redop")))
if not series:
    sys.exit("plot.sh: no busbw lines (inplace=%d) in %s" % (inplace, " ".join(args)))

# Labels: LABEL= wins; else impl (+ collective when several); + file name on clashes.
collectives = {k[3] for k in series}
def base(k):
    if k[1]:
        return k[1]
    return k[2] + (" " + k[3] if len(collectives) > 1 else "")
counts = {}
for k in series:
    counts[base(k)] = counts.get(base(k), 0) + 1
def label(k):
    b = base(k)
    if counts[b] > 1 and not k[1]:
        b += " (" + os.path.splitext(os.path.basename(k[4]))[0] + ")"
    return b.replace('"', "'")

sizes = sorted({s for d in series.values() for s in d})
lo, hi = sizes[0], sizes[-1]
tics, p = [], 1
while p < lo:
    p *= 2
allp = []
while p <= hi:
    allp.append(p)
    p *= 2
step = 1
while len(allp[::step]) > 12:
    step *= 2
for p in allp[::step]:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("", 1)):
        if p >= k:
            tics.append('"%d%s" %d' % (p // k, unit, p))
            break

plots = []
for n, (k, d) in enumerate(series.items()):  # in the order of the command line
    f = os.path.join(tmp, "s%d.dat" % n)
    with open(f, "w") as out:
        for s in sorted(d):
            out.write("%d %.6g\n" % (s, statistics.median(d[s])))
    plots.append("'%s' using 1:2 with linespoints lw 2 pt 7 ps 0.8 title \"%s\"" % (f, label(k)))
for t in limits_wanted:
    if t in limits:
        v = statistics.median(limits[t])
        plots.append("%.6g with lines dt %d lw 1.5 lc rgb \"#606060\" title \"%s limit %.2f GB/s\""
                     % (v, 2 + len(plots) % 3, t, v))

title = os.environ["TITLE"]
if not title:
    parts = []
    for c, r, ty, op in sorted(meta, key=str):
        parts.append("%s, %s ranks, %s %s" % (c, r, ty, op))
    title = "; ".join(parts) + (" (in-place)" if inplace else "")
print('set terminal pngcairo noenhanced size %s font "sans,10"' % os.environ["SIZE"])
print('set output "%s"' % png.replace('"', '\\"'))
print('set title "%s"' % title.replace('"', "'"))
print("set logscale x 2")
print("set xrange [%g:%g]" % (lo / 1.5, hi * 1.5))
print("set xtics (%s)" % ", ".join(tics))
print('set xlabel "message size (bytes)"')
print('set ylabel "busbw (GB/s)"')
if os.environ["LOGY"] == "1":
    print("set logscale y 10")
else:
    print("set yrange [0:*]")
print("set grid")
print("set key below samplen 2 spacing 1.1 font \",9\"")
print("plot " + ", \\\n     ".join(plots))
PY
gnuplot "$tmp/plot.gp"
echo "plot.sh: wrote $png" >&2
