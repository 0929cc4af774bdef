#!/usr/bin/env bash
# bench/compare.sh - cclite's allreduce (or another collective, -C) beside Open MPI's,
# 2 ranks on this node, and beside this machine's limits, all measured in the same
# run (DESIGN.md: every performance claim sits beside a peer and the machine's limit).
#
#   bench/compare.sh shm            # cclite over shm vs MPI over its shared-memory BTL
#   bench/compare.sh tcp            # CCLITE_SHM_DISABLE=1 vs MPI over --mca btl tcp,self
#   bench/compare.sh -r 5 -p tcp build-release
#   bench/compare.sh -p -m shm      # MPI also with glibc malloc tuned; the better MPI figure is shown
#   bench/compare.sh -C allgather shm   # allgather_perf beside MPI_Allgather
#
# Options: -C COLLECTIVE (allreduce, the default; allgather, reduce_scatter, alltoall,
# broadcast, reduce, sendrecv, gather, scatter, scan, exscan: <collective>_perf beside allreduce_perf_mpi -C
# <collective>, the same sizes, inputs and checks, out of place, root 0);
# -r runs (default 3; each size's median over the runs is shown, with
# [min..max]); -m: run MPI a second time with MPI_TUNED_ENV (default
# "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296":
# Open MPI's per-call temporary buffer of >= 32 MiB then comes from the heap
# instead of a fresh mmap whose pages fault on every call; glibc caps
# mmap_threshold at 32 MiB, so only mmap_max=0 reaches 64 MiB messages) and show,
# per size, the better of the two MPI medians, marked (t) when the tuned run
# won; -p: start every program in a session of its own at autogroup
# nice -20 (root only; on a machine where other sessions compete, Linux shares the
# CPUs between sessions first, so a 2-rank job otherwise gets about one core's
# worth; applied to cclite, MPI and machine_limits alike); -k DIR: keep the JSON
# lines and logs in DIR (default: a temporary directory, removed); last argument:
# the build directory (default build).
# Environment: BW_ARGS (default "-b 64K -e 4M -f 4 -n 200 -w 50; -b 16M -e 64M -f 4";
# ';' separates argument sets run one after the other: the sizes up to 4 MiB get
# 200 timed calls, so that each size is timed over milliseconds rather than the
# ~0.1 ms that nccl-tests' default 20 calls of 64 KiB take, which one preemption
# on a shared machine used to dominate), LAT_ARGS (default
# "-b 8 -e 64K -f 2 -n 2000 -w 200": one preemption of a few hundred us must not
# move a 0.5 us mean), COMMON_ARGS (default "-d float -o sum"),
# MPIRUN_ARGS (added to mpirun, e.g. "--mca mpi_yield_when_idle 1"),
# LIMITS_ARGS (default "-n 9"), RUN_TIMEOUT seconds per program (default 900).
#
# Each run executes, back to back: cclite bandwidth, MPI bandwidth (then MPI tuned, -m), cclite latency,
# MPI latency, so that load from other programs hits both alike. Programs:
#   cclite: build/bin/cclite-run --nproc-per-node 2 build/bin/allreduce_perf ...
#   MPI:    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --mca pml ob1
#           --mca btl self,vader|self,tcp build/bin/allreduce_perf_mpi ...
# (pml ob1, because the default pml ucx would ignore the btl choice; --bind-to none,
# because cclite-run does not pin either; vader is Open MPI 4's shared-memory BTL,
# Open MPI 5 calls it sm: the script asks ompi_info.) Then build/bin/machine_limits.
# The tables use the out-of-place columns and each program's -J JSON lines. The
# "% limit" columns divide busbw by the limit that bounds the transport: 1-thread
# memcpy for shm, loopback TCP per-direction throughput with both directions busy
# for tcp. With 2 ranks busbw = algbw, and a ring moves S bytes each way per call.
# Needs python3; MPI columns show "-" when allreduce_perf_mpi or mpirun is missing
# (scripts/install-bench-deps.sh installs Open MPI).
set -euo pipefail

runs=3
prio=""
keep=""
tuned=""
coll=allreduce
usage() { sed -n '2,50p' "$0" >&2; exit 2; }
while getopts "r:pmk:C:h" opt; do
  case $opt in
    C) coll=$OPTARG ;;
    r) runs=$OPTARG ;;
    p) prio=1 ;;
    m) tuned=1 ;;
    k) keep=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
mode=${1:-shm}
build=${2:-build}
case $mode in shm|tcp) ;; *) echo "compare.sh: mode must be shm or tcp, not '$mode'" >&2; usage ;; esac
case $runs in ''|*[!0-9]*|0) echo "compare.sh: -r needs a positive integer" >&2; exit 2 ;; esac
case $coll in
  allreduce) cclite_prog=allreduce_perf; mpi_coll=() ;;
  allgather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|scan|exscan) cclite_prog=${coll}_perf; mpi_coll=(-C "$coll") ;;
  *) echo "compare.sh: -C must name allreduce, allgather, reduce_scatter, alltoall, broadcast, reduce, sendrecv, gather, scatter, scan or exscan, not '$coll'" >&2; exit 2 ;;
esac
[ -n "$prio" ] && [ "$(id -u)" != 0 ] && { echo "compare.sh: -p needs root (autogroup nice -20)" >&2; exit 2; }

bin=$build/bin
for p in cclite-run "$cclite_prog" machine_limits; do
  [ -x "$bin/$p" ] || { echo "compare.sh: no $bin/$p: build first (cmake -S . -B $build && cmake --build $build -j2)" >&2; exit 2; }
done
command -v python3 > /dev/null || { echo "compare.sh: needs python3" >&2; exit 2; }

BW_ARGS=${BW_ARGS:-"-b 64K -e 4M -f 4 -n 200 -w 50; -b 16M -e 64M -f 4"}
MPI_TUNED_ENV=${MPI_TUNED_ENV:-"GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"}
LAT_ARGS=${LAT_ARGS:-"-b 8 -e 64K -f 2 -n 2000 -w 200"}
COMMON_ARGS=${COMMON_ARGS:-"-d float -o sum"}
MPIRUN_ARGS=${MPIRUN_ARGS:-}
LIMITS_ARGS=${LIMITS_ARGS:-"-n 9"}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}

have_mpi=""
if [ -x "$bin/allreduce_perf_mpi" ] && command -v mpirun > /dev/null; then have_mpi=1; fi
if [ -z "$have_mpi" ]; then
  echo "compare.sh: no $bin/allreduce_perf_mpi or mpirun: MPI columns will be empty" \
    "(scripts/install-bench-deps.sh, then re-run cmake)" >&2
fi

if [ -n "$keep" ]; then
  out=$keep
  mkdir -p "$out"
  rm -f "$out"/*.json "$out"/*.log
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

# Open MPI 4 names its shared-memory BTL vader, Open MPI 5 sm.
shm_btl=vader
if [ -n "$have_mpi" ] && command -v ompi_info > /dev/null; then
  if ompi_info 2> /dev/null | grep -q 'MCA btl: vader'; then shm_btl=vader
  elif ompi_info 2> /dev/null | grep -q 'MCA btl: sm'; then shm_btl=sm; fi
fi
if [ "$mode" = shm ]; then
  btl="self,$shm_btl"
  cclite_env=()
else
  btl="tcp,self"
  cclite_env=(env CCLITE_SHM_DISABLE=1)
fi
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --mca pml ob1 --mca btl "$btl")
# shellcheck disable=SC2206  # MPIRUN_ARGS is a list of words on purpose
[ -n "$MPIRUN_ARGS" ] && mpirun_cmd+=($MPIRUN_ARGS)

launch() {
  if [ -n "$prio" ]; then
    setsid -w sh -c 'echo -20 > /proc/$$/autogroup; exec "$@"' sh "$@"
  else
    "$@"
  fi
}

# run NAME LOG CMD...: runs one program with a time limit; on failure shows its log.
run() {
  local name=$1 log=$2
  shift 2
  echo "compare.sh: $name" >&2
  if ! launch timeout "$RUN_TIMEOUT" "$@" >> "$log" 2>&1; then
    echo "compare.sh: $name failed (log $log):" >&2
    tail -20 "$log" >&2
    exit 1
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
tuned_x=()
for kv in $MPI_TUNED_ENV; do tuned_x+=(-x "$kv"); done
# shellcheck disable=SC2086  # the *_ARGS are lists of words on purpose
for ((i = 1; i <= runs; ++i)); do
  for kind in bw lat; do
    if [ $kind = bw ]; then all_args=$BW_ARGS; else all_args=$LAT_ARGS; fi
    IFS=';' read -r -a arg_sets <<< "$all_args"
    for args in "${arg_sets[@]}"; do
      run "run $i/$runs: cclite $mode $kind $args" "$out/cclite-$kind.log" \
        "${cclite_env[@]}" "$bin/cclite-run" --nproc-per-node 2 "$bin/$cclite_prog" \
        $COMMON_ARGS $args -J "$out/cclite-$mode-$kind.json"
      if [ -n "$have_mpi" ]; then
        run "run $i/$runs: mpi $mode $kind $args" "$out/mpi-$kind.log" \
          "${mpirun_cmd[@]}" "$bin/allreduce_perf_mpi" "${mpi_coll[@]}" $COMMON_ARGS $args -J "$out/mpi-$mode-$kind.json"
        if [ -n "$tuned" ]; then
          run "run $i/$runs: mpi (malloc tuned) $mode $kind $args" "$out/mpi-tuned-$kind.log" \
            "${mpirun_cmd[@]}" "${tuned_x[@]}" "$bin/allreduce_perf_mpi" "${mpi_coll[@]}" $COMMON_ARGS $args \
            -J "$out/mpi-tuned-$mode-$kind.json"
        fi
      fi
    done
  done
done
# shellcheck disable=SC2086
run "machine_limits" "$out/limits.log" "$bin/machine_limits" $LIMITS_ARGS -J "$out/limits.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mpi_desc="not available"
if [ -n "$have_mpi" ]; then
  mpi_desc="$(mpirun --version 2> /dev/null | head -1), pml ob1, btl $btl${MPIRUN_ARGS:+, $MPIRUN_ARGS}"
  [ -n "$tuned" ] && mpi_desc="$mpi_desc; better of as-is and (t) $MPI_TUNED_ENV"
fi
transport=$(grep -m1 -o 'ring via [a-z]*' "$out/cclite-bw.log" | sed 's/ring via //' || true)

python3 - "$out" "$mode" "$runs" "$coll" <<PY
import json, os, statistics, sys
out, mode, runs, coll = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def load(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []

def by_size(rows, field):
    d = {}
    for r in rows:
        if r.get("inplace", 0) == 0 and r.get("collective") == coll:
            d.setdefault(r["size"], []).append(r[field])
    return d

def human(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return "%d B" % b

def cell(vals, fmt):
    if not vals:
        return "-"
    return (fmt + " [" + fmt + ".." + fmt + "]") % (statistics.median(vals), min(vals), max(vals))

limits = {r["test"]: r for r in load("limits.json")}
limit_name = "memcpy" if mode == "shm" else "tcp_bidir"
limit = limits.get(limit_name, {}).get("gbps")
wrong = sum(r.get("wrong", 0) for f in os.listdir(out) if f.endswith(".json") and f != "limits.json"
            for r in load(f))

print("# %s, 2 ranks on one node, %s; ${COMMON_ARGS}, out-of-place; median of %d runs [min..max]"
      % (coll, mode, runs))
print("# cclite: transport ${transport:-?}; MPI: ${mpi_desc}")
print("# host $(hostname), $(nproc) CPUs, load average before ${load_before}, after ${load_after}${prio:+; autogroup nice -20}; $(date -u +%Y-%m-%dT%H:%MZ)")
print()
def better(plain, tuned, higher):
    # per size, the MPI variant with the better median; the tuned one marked
    out, mark = {}, {}
    for s in set(plain) | set(tuned):
        p, t = plain.get(s, []), tuned.get(s, [])
        use_t = t and (not p or (statistics.median(t) > statistics.median(p)) == higher
                       and statistics.median(t) != statistics.median(p))
        out[s], mark[s] = (t, " (t)") if use_t else (p, "")
    return out, mark

cb = by_size(load("cclite-%s-bw.json" % mode), "busbw")
mb, mb_mark = better(by_size(load("mpi-%s-bw.json" % mode), "busbw"),
                     by_size(load("mpi-tuned-%s-bw.json" % mode), "busbw"), True)
print("busbw (GB/s, higher is better; bw args: ${BW_ARGS}); %% limit = busbw / %s %s GB/s"
      % (limit_name, "%.2f" % limit if limit else "?"))
print()
print("| size | cclite busbw | MPI busbw | cclite/MPI | cclite %% %s | MPI %% %s |" % (limit_name, limit_name))
print("|---:|---:|---:|---:|---:|---:|")
for s in sorted(set(cb) | set(mb)):
    c, m = cb.get(s, []), mb.get(s, [])
    ratio = "%.2f" % (statistics.median(c) / statistics.median(m)) if c and m and statistics.median(m) > 0 else "-"
    pc = "%.0f %%" % (100 * statistics.median(c) / limit) if c and limit else "-"
    pm = "%.0f %%" % (100 * statistics.median(m) / limit) if m and limit else "-"
    print("| %s | %s | %s%s | %s | %s | %s |" % (human(s), cell(c, "%.2f"), cell(m, "%.2f"), mb_mark.get(s, ""), ratio, pc, pm))
print()
ct = by_size(load("cclite-%s-lat.json" % mode), "time_us")
mt, mt_mark = better(by_size(load("mpi-%s-lat.json" % mode), "time_us"),
                     by_size(load("mpi-tuned-%s-lat.json" % mode), "time_us"), False)
print("latency (time per call in us, lower is better; lat args: ${LAT_ARGS}); cclite/MPI > 1: cclite slower")
print()
print("| size | cclite us | MPI us | cclite/MPI |")
print("|---:|---:|---:|---:|")
for s in sorted(set(ct) | set(mt)):
    c, m = ct.get(s, []), mt.get(s, [])
    ratio = "%.2f" % (statistics.median(c) / statistics.median(m)) if c and m and statistics.median(m) > 0 else "-"
    print("| %s | %s | %s%s | %s |" % (human(s), cell(c, "%.1f"), cell(m, "%.1f"), mt_mark.get(s, ""), ratio))
print()
print("machine limits, same run (machine_limits ${LIMITS_ARGS}; GB/s = 1e9 B/s, median [min..max])")
print()
print("| test | GB/s | counts |")
print("|---|---:|---|")
for name, r in limits.items():
    print("| %s | %.2f [%.2f..%.2f] | %s |" % (name, r["gbps"], r["gbps_min"], r["gbps_max"], r["counts"]))
if wrong:
    print("\n# WARNING: %d wrong elements in the #wrong columns: see the logs" % wrong)
PY
if [ -n "$keep" ]; then echo "# JSON lines and logs in $out" >&2; fi
