#!/bin/sh
# tests/netns/mpirun_test.sh - cclite programs started by Debian's real Open MPI
# mpirun, with no code change (the ranks come from OMPI_COMM_WORLD_*):
#   1. -x CCLITE_RDZV_ENDPOINT=127.0.0.1:PORT, with a hostfile: hello_allreduce
#      and collectives_check pass (rank 0 hosts the TCP store);
#   2. -x CCLITE_RDZV_DIR=DIR: the file store; collectives_check passes;
#   3. neither, one node: the ranks meet in mpirun's session directory
#      (launch_env.hpp) and pass; mpirun removes that directory at the end.
#      (Across nodes the same command fails at once with a message naming
#      both variables and the mpirun -x spelling: tests/launch_env_test.cpp,
#      as this machine has one node.)
# Exit 0 pass, 1 fail, 77 skipped (no mpirun: scripts/install-deps.sh installs openmpi-bin).
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun is not installed (apt-get install openmpi-bin)"; exit 77; }
mpirun --version 2>&1 | grep -q "Open MPI" || { echo "SKIP: mpirun is not Open MPI's"; exit 77; }
for p in hello_allreduce collectives_check; do
  [ -x "$BIN/$p" ] || { echo "FAIL: $BIN/$p is not built"; exit 1; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cclite-mpirun.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# Whatever launched us must not leak a rendezvous into the ranks.
unset MASTER_ADDR MASTER_PORT CCLITE_RDZV_ENDPOINT CCLITE_RDZV_DIR CCLITE_RDZV_ID RANK WORLD_SIZE \
  LOCAL_RANK LOCAL_WORLD_SIZE CCLITE_RANK CCLITE_WORLD_SIZE TORCHELASTIC_RUN_ID
ROOT=""
[ "$(id -u)" = 0 ] && ROOT="--allow-run-as-root"
# Guard against a hang: every rank bounds its waits too (CCLITE_TIMEOUT).
MPIRUN="timeout -k 5 120 mpirun $ROOT --oversubscribe -np 2 -x CCLITE_TIMEOUT=60"
STATUS=0
fail() {
  echo "FAIL: $*"
  STATUS=1
}

# 1. TCP store at an endpoint. A port another process holds makes rank 0's
#    store fail to bind; try a few.
echo "localhost slots=2" >"$TMP/hosts"
for try in 1 2 3; do
  port=$((20000 + ($$ * 7 + try * 1009) % 30000))
  $MPIRUN -hostfile "$TMP/hosts" -x CCLITE_RDZV_ENDPOINT=127.0.0.1:$port "$BIN/hello_allreduce" >"$TMP/hello.log" 2>&1
  rc=$?
  grep -q "cannot listen" "$TMP/hello.log" || break
done
cat "$TMP/hello.log"
[ "$rc" = 0 ] || fail "hello_allreduce under mpirun -x CCLITE_RDZV_ENDPOINT exited $rc"
[ "$(grep -c 'sum of ranks = 1 (correct)' "$TMP/hello.log")" = 2 ] || fail "hello_allreduce: not both ranks correct"

$MPIRUN -x CCLITE_RDZV_ENDPOINT=127.0.0.1:$port "$BIN/collectives_check" --count 65536 >"$TMP/coll.log" 2>&1
rc=$?
cat "$TMP/coll.log"
[ "$rc" = 0 ] || fail "collectives_check under mpirun -x CCLITE_RDZV_ENDPOINT exited $rc"
[ "$(grep -c 'checks passed' "$TMP/coll.log")" = 2 ] || fail "collectives_check (endpoint): not both ranks passed"

# 2. File store in a directory (on a cluster: one every node mounts).
mkdir "$TMP/rdzv"
$MPIRUN -x CCLITE_RDZV_DIR="$TMP/rdzv" "$BIN/collectives_check" --count 65536 >"$TMP/dir.log" 2>&1
rc=$?
cat "$TMP/dir.log"
[ "$rc" = 0 ] || fail "collectives_check under mpirun -x CCLITE_RDZV_DIR exited $rc"
[ "$(grep -c 'checks passed' "$TMP/dir.log")" = 2 ] || fail "collectives_check (dir): not both ranks passed"

# 3. Neither, on one node: no variable needed.
$MPIRUN -x CCLITE_DEBUG=INFO "$BIN/hello_allreduce" >"$TMP/none.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$TMP/none.log"; fail "one node without a rendezvous variable: mpirun exited $rc"; }
[ "$(grep -c 'sum of ranks = 1 (correct)' "$TMP/none.log")" = 2 ] || fail "one node, no variable: not both ranks correct"
store=$(sed -n "s/.*INFO init: launcher openmpi, file store in \([^ ]*\) (mpirun's session directory).*/\1/p" "$TMP/none.log")
[ -n "$store" ] || fail "one node, no variable: rank 0 did not log the session-directory store"
[ -n "$store" ] && [ -e "$store" ] && fail "mpirun left the store directory $store behind"

[ "$STATUS" = 0 ] && echo "PASS: mpirun"
exit "$STATUS"
