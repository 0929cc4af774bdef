#!/bin/sh
# tests/netns/torchrun_test.sh - cclite programs started by a real torchrun
# (Debian's python3-torch), with no code change:
#   1. static rendezvous (torchrun's default): its agent hosts a c10d TCPStore
#      at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so no
#      rank may bind that port; every rank is a client of torchrun's store
#      (tcp/torch_store.hpp): hello_allreduce (2 ranks), collectives_check (3);
#   2. --standalone (torch 1.x: worker rank 0 hosts cclite's own store at a
#      free MASTER_PORT; torch >= 2.4: the agent's store again);
#   3. a restart (--max_restarts 1): rank 1 fails before init in the first
#      attempt; the second attempt passes, reading nothing the first one left
#      in the store that outlived it (keys are per TORCHELASTIC_RESTART_COUNT);
#   4. the other way round: a torch.distributed program (gloo) under cclite-run,
#      which sets torchrun's variables for its workers;
#   5. two simulated nodes (nodes.sh, root only), static rendezvous: node 1's
#      ranks meet in node 0's agent store; every collective passes, over shm
#      inside a node and tcp between them;
#   6. the same two nodes with the c10d rendezvous (--rdzv_endpoint at node 0):
#      torch >= 2.4's workers meet in the agents' store, torch 1.x's in cclite's.
# Exit 0 pass, 1 fail, 77 skipped (no torchrun: scripts/install-deps.sh installs
# python3-torch). Every wait is bounded.
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)
command -v torchrun >/dev/null 2>&1 || { echo "SKIP: torchrun is not installed (apt-get install python3-torch)"; exit 77; }
torchrun --help >/dev/null 2>&1 || { echo "SKIP: torchrun does not start (torch not importable?)"; exit 77; }
for p in hello_allreduce collectives_check; do
  [ -x "$BIN/$p" ] || { echo "FAIL: $BIN/$p is not built"; exit 1; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cclite-torchrun.XXXXXX")
# torchrun's agent makes a torchelastic_* directory per run under TMPDIR and
# leaves it there: ours go into TMP, which a passing run removes.
export TMPDIR="$TMP"
# Whatever launched us must not leak a rendezvous into the ranks.
unset MASTER_ADDR MASTER_PORT CCLITE_RDZV_ENDPOINT CCLITE_RDZV_DIR CCLITE_RDZV_ID RANK WORLD_SIZE \
  LOCAL_RANK LOCAL_WORLD_SIZE CCLITE_RANK CCLITE_WORLD_SIZE TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE
export CCLITE_TIMEOUT=60 CCLITE_DEBUG=INFO
# Spelled with underscores, as torch 1.x wants (2.x takes both). --redirects 1
# --tee 1: torch 1.13 under Python 3.11 cannot parse its default "0" (an
# IntFlag change; every worker launch fails), and 1 keeps stdout on our log.
TORCHRUN="timeout -k 5 150 torchrun --redirects 1 --tee 1 --monitor_interval 1"
STATUS=0
fail() {
  echo "FAIL: $*"
  STATUS=1
}
show() {
  echo "----- $1"
  cat "$TMP/$1"
}
# count FILE PATTERN: lines matching
count() { grep -c -- "$2" "$TMP/$1"; }
# A port below Linux's ephemeral range (32768+, which the other tests' own
# connections use); try_ports retries with others when torchrun's agent could
# not bind it.
port() { echo $((20000 + ($$ * 7 + $1 * 1009) % 12000)); }
# try_ports LOG K TORCHRUN-ARGS...: runs $TORCHRUN --master_port P ARGS for up
# to three ports P from port K; rc in $rc.
try_ports() {
  log=$1 k=$2
  shift 2
  for try in 0 1 2; do
    $TORCHRUN --master_port "$(port $((k + try * 10)))" "$@" >"$TMP/$log" 2>&1
    rc=$?
    grep -q "Address already in use" "$TMP/$log" || break
  done
}

# 1. Static rendezvous: torchrun's agent hosts the store.
try_ports static.log 1 --nproc_per_node 2 --no_python "$BIN/hello_allreduce"
show static.log
[ "$rc" = 0 ] || fail "hello_allreduce under torchrun (static) exited $rc"
[ "$(count static.log 'sum of ranks = 1 (correct)')" = 2 ] || fail "static: not both ranks correct"
grep -q "rendezvous through torchrun's store at .*TORCHELASTIC_USE_AGENT_STORE=True" "$TMP/static.log" ||
  fail "static: the log does not say the ranks met in torchrun's store"

try_ports coll.log 2 --nproc_per_node 3 --no_python "$BIN/collectives_check" --count 65536
show coll.log
[ "$rc" = 0 ] || fail "collectives_check under torchrun (static) exited $rc"
[ "$(count coll.log 'checks passed')" = 3 ] || fail "static: not all 3 ranks passed collectives_check"

# 2. --standalone.
$TORCHRUN --standalone --nproc_per_node 2 --no_python "$BIN/hello_allreduce" >"$TMP/standalone.log" 2>&1
rc=$?
show standalone.log
[ "$rc" = 0 ] || fail "hello_allreduce under torchrun --standalone exited $rc"
[ "$(count standalone.log 'sum of ranks = 1 (correct)')" = 2 ] || fail "standalone: not both ranks correct"

# 3. A restart: the first attempt's rank 1 fails before it meets anyone, while
#    rank 0 has already written its address under attempt 0.
cat >"$TMP/flaky.sh" <<EOF
#!/bin/sh
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then sleep 2; echo "rank 1 fails in attempt 0"; exit 3; fi
exec "$BIN/collectives_check" --count 65536
EOF
chmod +x "$TMP/flaky.sh"
try_ports restart.log 3 --nproc_per_node 2 --max_restarts 1 --no_python "$TMP/flaky.sh"
show restart.log
[ "$rc" = 0 ] || fail "torchrun --max_restarts 1 exited $rc"
grep -q "rank 1 fails in attempt 0" "$TMP/restart.log" || fail "restart: the first attempt did not fail as planned"
[ "$(count restart.log 'checks passed')" = 2 ] || fail "restart: not both ranks of the second attempt passed"

# 4. The other way round: a torch.distributed program (gloo) under cclite-run,
#    which sets torchrun's variables.
PY=$(head -n 1 "$(command -v torchrun)" | sed 's/^#! *//')
if [ -x "$BIN/cclite-run" ] && $PY -c "import torch.distributed" 2>/dev/null; then
  cat >"$TMP/tdist.py" <<'EOF2'
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("torch rank %d of %d: sum %s" % (dist.get_rank(), dist.get_world_size(), t.tolist()), flush=True)
dist.destroy_process_group()
EOF2
  timeout -k 5 120 "$BIN/cclite-run" --nproc-per-node 3 $PY "$TMP/tdist.py" >"$TMP/torch_prog.log" 2>&1
  rc=$?
  show torch_prog.log
  [ "$rc" = 0 ] || fail "a torch.distributed program under cclite-run exited $rc"
  [ "$(count torch_prog.log 'of 3: sum \[6.0, 6.0, 6.0, 6.0\]')" = 3 ] || fail "torch program: not all 3 ranks reduced"
else
  echo "torch program under cclite-run skipped: no cclite-run or torch.distributed"
fi

# 5. Two simulated nodes, static rendezvous at node 0's agent.
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null 2>&1; then
  . "$HERE/nodes.sh"
  (nodes_require) >/dev/null 2>&1 && NODES=1
fi
# on_two_nodes NAME TORCHRUN-ARGS...: the same torchrun line on both nodes
# (--node_rank $i where the args say NODE_RANK), collectives_check on 2 ranks
# each; every check passed, and the ranks reached the other node over tcp.
on_two_nodes() {
  name=$1
  shift
  for i in 0 1; do
    node_run "$i" "$TMP/$name$i.log" $TORCHRUN $(echo "$@" | sed "s/NODE_RANK/$i/") \
      --nproc_per_node 2 --no_python "$BIN/collectives_check" --count 262144
  done
  for i in 0 1; do
    node_wait "$i" 180
    eval "rc=\$NODE_RC_$i"
    show "$name$i.log"
    [ "$rc" = 0 ] || fail "$name, node $i: torchrun exited $rc"
    [ "$(count "$name$i.log" 'checks passed')" = 2 ] || fail "$name, node $i: not both ranks passed"
    grep -q "(node$((1 - i)), pid [0-9]*): via tcp" "$TMP/$name$i.log" || fail "$name, node $i: no tcp peer on the other node"
  done
}
if [ -n "$NODES" ]; then
  nodes_up 2
  m=$(node_addr 0)
  on_two_nodes node --nnodes 2 --node_rank NODE_RANK --master_addr "$m" --master_port 29500
  grep -q "rendezvous through torchrun's store at $m:29500" "$TMP/node1.log" ||
    fail "node 1: its ranks did not meet in node 0's agent store"

  # 6. The same nodes with the c10d rendezvous at node 0 (torchrun's usual
  #    multi-node line), by host name as on a cluster: torch's agent hosts the
  #    rendezvous store where the endpoint names its own host name, so every
  #    node gets an /etc/hosts naming the others (and itself 127.0.1.1, as
  #    Debian does). torch >= 2.4 tells its workers to use that agent store;
  #    torch 1.x does not, and worker rank 0 hosts cclite's own store at the
  #    MASTER_PORT node 0's agent picked.
  nodes_hosts
  on_two_nodes c10d --nnodes 2 --rdzv_backend c10d --rdzv_endpoint node0:29400 --rdzv_id cclite-c10d
  if $PY -c 'import sys, torch; v = torch.__version__.split("."); sys.exit((int(v[0]), int(v[1])) < (2, 4))'; then
    grep -q "rendezvous through torchrun's store" "$TMP/c10d1.log" ||
      fail "c10d: torch >= 2.4, but node 1's ranks did not meet in the agents' store"
  elif grep -q "rendezvous through torchrun's store" "$TMP/c10d1.log"; then
    fail "c10d: torch < 2.4 says TORCHELASTIC_USE_AGENT_STORE=False, yet the ranks used its store"
  fi
else
  echo "two-node cases skipped: need root and ip netns"
fi

[ "$STATUS" = 0 ] && rm -rf "$TMP" && echo "PASS"
exit "$STATUS"
