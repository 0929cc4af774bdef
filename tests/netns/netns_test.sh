#!/bin/sh
# tests/netns/netns_test.sh CASE - one multi-node case on simulated nodes
# (nodes.sh): the same cclite-run command on every node, as on a cluster.
#
#   2x2           2 nodes x 2 ranks: every collective correct; the INFO log
#                 shows shm inside a node, tcp between nodes, and the
#                 hierarchical algorithm for the large allreduce
#   3x1           3 nodes x 1 rank: every collective correct, all over tcp
#   hostnames     2 nodes x 2 ranks, --rdzv-endpoint node0:29400 by name, where
#                 node0 resolves its own name to 127.0.1.1 (Debian's /etc/hosts)
#   ifname        2 interfaces per node; CCLITE_SOCKET_IFNAME=eth1 carries
#                 the data (eth1's byte counters), the endpoint is on eth0
#   ifname_auto   2 interfaces per node, no CCLITE_SOCKET_IFNAME, the endpoint
#                 on eth1: the data path follows the route to the rendezvous
#                 host (eth1), not the first interface (eth0)
#   ifname_wrong  CCLITE_SOCKET_IFNAME naming no interface, then lo: a clear
#                 error on every node, no hang
#   agent_killed  node 1's agent is SIGKILLed mid-job: node 0 exits non-zero
#                 with a message naming node1; then the same with node 0's
#                 (the store's host)
#   elastic       3 nodes, --nnodes 2:3 --max-restarts 1; node 2's agent is
#                 SIGKILLed mid-job: nodes 0 and 1 meet again as a 2-node job
#                 and the restarted workers pass every check
#   elastic_grow  --nnodes 2:3: nodes 0 and 1 run a 2-node job; node 2's agent
#                 arrives mid-job and is taken in (scale-up): every node restarts
#                 its workers, without counting a restart, and the 3-node job
#                 passes every check
#   rdzv_id       an agent of another --rdzv-id at the same endpoint is
#                 refused; the job itself completes
#   srun          2 nodes x 2 ranks started as srun starts them (its variables,
#                 no cclite-run, no endpoint): the ranks meet on the first node
#                 of SLURM_STEP_NODELIST=node[0-1] at a port from the job id
#   trace_request 2 nodes x 2 ranks, the flight recorder on: rank 3 (node 1)
#                 exits outside cclite while rank 1 (node 0) computes: node 0's
#                 cclite-run, told of node 1's failure, asks rank 1 for its file
#                 before stopping it, and cclite-trace names rank 1's last call
#   host_lost     jobs of 2 nodes x 2 ranks started directly (no agents): a
#                 node goes silent mid-job (its link deleted, its processes
#                 killed, so no FIN or RST ever leaves it): the other node's
#                 ranks get peer_lost naming it ("host down or network cut")
#                 within about 30 s, long before CCLITE_TIMEOUT; the same for
#                 the host of the job's store (also with 3 ranks per node and
#                 the ring: a rank linked only by shm learns why through the
#                 link the finder closes); and under cclite-run, the
#                 agents' store host: the other node's agent stops its
#                 workers and exits once the store is silent (--node-timeout)
#   host_lost_connect  the same, with the node lost before a first
#                 connection to it (a sendrecv with rank r + 2 after init):
#                 the connecting ranks find no answer, the accepting ones
#                 probe the silent listener (or the silent store)
#   srun_agents   2 nodes, one cclite-run per node started as srun starts a
#                 task (its variables; no --nnodes, no endpoint), 2 workers
#                 each: the agents meet on node0 at a port from the job id
#
# Exit 0 pass, 1 fail, 77 skipped (not root, no ip netns). Every wait is
# bounded; the namespaces go away on any exit. Needs CCLITE_BIN_DIR (ctest sets it).
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/nodes.sh"
BIN=${CCLITE_BIN_DIR:-build/bin}
BIN=$(cd "$BIN" && pwd)
CASE=$1
STATUS=0

nodes_require
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/cclite-netns-$CASE.XXXXXX")
[ -x "$BIN/cclite-run" ] && [ -x "$BIN/collectives_check" ] || { echo "FAIL: build cclite-run and collectives_check first ($BIN)"; exit 1; }

fail() {
  echo "FAIL: $*"
  STATUS=1
}
show_logs() {
  for f in "$LOGS"/*.log; do
    echo "----- $(basename "$f")"
    cat "$f"
  done
}
finish() {
  [ "$STATUS" = 0 ] || show_logs
  [ "$STATUS" = 0 ] && rm -rf "$LOGS" && echo "PASS: $CASE"
  exit "$STATUS"
}
# grep_log FILE PATTERN WHAT: fail unless FILE has a line matching PATTERN.
grep_log() {
  grep -q -- "$2" "$1" || fail "$3 (no line matching '$2' in $(basename "$1"))"
}

# run_job K NPROC TIMEOUT [ENV=V...] -- ARGS...: the same command on nodes 0..K-1,
# endpoint on node 0; waits for all; RC_<i> per node.
run_job() {
  k=$1; nproc=$2; limit=$3; shift 3
  envs=""
  while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
  shift
  i=0
  while [ "$i" -lt "$k" ]; do
    # shellcheck disable=SC2086
    node_run "$i" "$LOGS/node$i.log" env CCLITE_DEBUG=INFO CCLITE_TIMEOUT=60 $envs \
      "$BIN/cclite-run" --nnodes "$k" --nproc-per-node "$nproc" --rdzv-id "t$$" \
      --rdzv-endpoint "${EP_HOST:-$(node_addr 0 "${EP_NET:-0}")}:29400" --rdzv-timeout 60 --timeout "$limit" "$@"
    i=$((i + 1))
  done
  i=0
  while [ "$i" -lt "$k" ]; do
    node_wait "$i" $((limit + 30))
    eval "RC_$i=\$NODE_RC_$i"
    i=$((i + 1))
  done
}

check_collectives() {
  k=$1; nproc=$2
  i=0
  while [ "$i" -lt "$k" ]; do
    eval "rc=\$RC_$i"
    [ "$rc" = 0 ] || fail "node $i: cclite-run exited $rc"
    n=$(grep -c "collectives_check: rank .* checks passed" "$LOGS/node$i.log")
    [ "$n" = "$nproc" ] || fail "node $i: $n of $nproc ranks passed every check"
    grep_log "$LOGS/node$i.log" "on node$i: " "node $i: ranks ran on hostname node$i"
    i=$((i + 1))
  done
}

case "$CASE" in
2x2)
  nodes_up 2
  run_job 2 2 120 -- "$BIN/collectives_check" --count 262144
  check_collectives 2 2
  for i in 0 1; do
    f="$LOGS/node$i.log"
    grep_log "$f" "peer rank [0-9]* (node$i, pid [0-9]*): via shm" "node $i: a peer on the same node goes through shm"
    grep_log "$f" "peer rank [0-9]* (node$((1 - i)), pid [0-9]*): via tcp" "node $i: a peer on the other node goes through tcp"
    if grep -q "(node$((1 - i)), pid [0-9]*): via shm" "$f"; then fail "node $i: shm to the other node"; fi
    grep_log "$f" "INFO node $i of 2 (host node$i" "node $i: the agents numbered the nodes"
  done
  grep_log "$LOGS/node0.log" "hosting the rendezvous store" "node 0 (the endpoint's host) hosts the agents' store"
  # 2 nodes x 2 ranks: the large allreduce goes hierarchical (shm inside, tcp across).
  grep -m1 "allreduce: 1048576 bytes" "$LOGS/node0.log"
  grep_log "$LOGS/node0.log" "allreduce: 1048576 bytes.*algorithm hierarchical" "the large allreduce is hierarchical"
  ;;
3x1)
  nodes_up 3
  run_job 3 1 120 -- "$BIN/collectives_check" --count 262144
  check_collectives 3 1
  for i in 0 1 2; do
    grep_log "$LOGS/node$i.log" "via tcp" "node $i: tcp between nodes"
    if grep -q "via shm" "$LOGS/node$i.log"; then fail "node $i: shm between different nodes"; fi
  done
  ;;
hostnames)
  nodes_up 2
  nodes_hosts
  EP_HOST=node0 run_job 2 2 120 -- "$BIN/collectives_check" --count 65536
  check_collectives 2 2
  grep_log "$LOGS/node1.log" "MASTER_ADDR=node0 " "the workers meet at node0 by name"
  grep_log "$LOGS/node0.log" "hosting the rendezvous store on 0.0.0.0:29400" "node0 listens on every address, not on 127.0.1.1 only"
  ;;
ifname)
  nodes_up 2 2
  for i in 0 1; do
    eval "TX_$i=$(ip netns exec "$(node_ns $i)" cat /sys/class/net/eth1/statistics/tx_bytes)"
  done
  run_job 2 1 120 CCLITE_SOCKET_IFNAME=eth1 -- "$BIN/collectives_check" --count 1048576
  check_collectives 2 1
  for i in 0 1; do
    f="$LOGS/node$i.log"
    grep_log "$f" "tcp: listening on $(node_addr "$i" 1):[0-9]*, interface CCLITE_SOCKET_IFNAME='eth1' selects eth1" "node $i: the tcp transport listens on eth1"
    grep_log "$f" "node address $(node_addr "$i" 1): CCLITE_SOCKET_IFNAME='eth1' selects eth1" "node $i: the agent publishes eth1's address"
    eval "before=\$TX_$i"
    after=$(ip netns exec "$(node_ns $i)" cat /sys/class/net/eth1/statistics/tx_bytes)
    # The large allreduce alone moves 4 MiB out of each of 2 nodes.
    [ $((after - before)) -gt 4000000 ] || fail "node $i: only $((after - before)) bytes left through eth1"
  done
  grep_log "$LOGS/node1.log" "MASTER_ADDR=$(node_addr 0 1) " "workers meet at node 0's eth1 address"
  ;;
ifname_auto)
  nodes_up 2 2
  EP_NET=1 run_job 2 1 120 -- "$BIN/collectives_check" --count 65536
  check_collectives 2 1
  for i in 0 1; do
    grep_log "$LOGS/node$i.log" "tcp: listening on $(node_addr "$i" 1):[0-9]*, interface eth1 $(node_addr "$i" 1) (CCLITE_SOCKET_IFNAME unset: the interface that routes to the rendezvous host $(node_addr 0 1)" "node $i: the data path follows the route to the rendezvous host"
  done
  ;;
ifname_wrong)
  nodes_up 2 2
  run_job 2 1 60 CCLITE_SOCKET_IFNAME=bogus0 -- "$BIN/collectives_check"
  for i in 0 1; do
    eval "rc=\$RC_$i"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "node $i: exit status $rc, wanted an error (not 0, not the timeout's 124)"
    grep_log "$LOGS/node$i.log" "CCLITE_SOCKET_IFNAME='bogus0' selects no interface" "node $i: the message names the variable"
    grep_log "$LOGS/node$i.log" "eth1 $(node_addr "$i" 1)" "node $i: the message lists the interfaces"
    mv "$LOGS/node$i.log" "$LOGS/bogus-node$i.log"
  done
  run_job 2 1 60 CCLITE_SOCKET_IFNAME==lo -- "$BIN/collectives_check"
  for i in 0 1; do
    eval "rc=\$RC_$i"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "node $i with lo: exit status $rc, wanted an error"
    grep_log "$LOGS/node$i.log" "a loopback address, but the job spans several hosts" "node $i: lo is refused with a reason"
  done
  ;;
agent_killed)
  nodes_up 2
  # kill_agent V: start the job, SIGKILL node V's agent mid-job; the other
  # node must fail (not time out) naming nodeV, and nothing of node V is left.
  kill_agent() {
    v=$1; o=$((1 - $1))
    i=0
    while [ "$i" -lt 2 ]; do
      node_run "$i" "$LOGS/kill$v-node$i.log" env CCLITE_TIMEOUT=60 "$BIN/cclite-run" --nnodes 2 --nproc-per-node 2 \
        --rdzv-id "t$$" --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --node-timeout 10 --timeout 200 \
        "$BIN/collectives_check" --count 65536 --repeat 100000000
      i=$((i + 1))
    done
    n=0
    until grep -q "iteration 1" "$LOGS/kill$v-node0.log" 2>/dev/null && grep -q "iteration 1" "$LOGS/kill$v-node1.log" 2>/dev/null; do
      n=$((n + 1))
      [ "$n" -lt 300 ] || { fail "the job never got going"; finish; }
      sleep 0.2
    done
    eval "kill -9 \$NODE_PID_$v"
    node_wait "$o" 120
    node_wait "$v" 5
    eval "rc=\$NODE_RC_$o"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "node $o: exit status $rc, wanted non-zero before the timeout"
    # Whichever notices first names node V: a worker's peer_lost, or the agent (heartbeat, or the store gone).
    grep_log "$LOGS/kill$v-node$o.log" "lost.*node$v\|node$v.*lost\|lost the rendezvous store.*host node$v" "node $o names the lost node$v"
    grep_log "$LOGS/kill$v-node$o.log" "^cclite-run: " "node $o's cclite-run reports the failure"
    # Node V's workers died with their agent (PR_SET_PDEATHSIG): nothing of it is left.
    n=0
    while [ -n "$(ip netns pids "$(node_ns "$v")")" ] && [ "$n" -lt 50 ]; do
      n=$((n + 1))
      sleep 0.1
    done
    left=$(ip netns pids "$(node_ns "$v")" | wc -l)
    [ "$left" = 0 ] || fail "$left processes left on node $v after its agent died"
  }
  kill_agent 1   # a node
  kill_agent 0   # the node that hosts the agents' store
  ;;
host_lost | host_lost_connect)
  # Jobs of ranks 0-3 on two nodes each (2 ranks per node), started as a
  # launcher without agents starts them (cclite-run's heartbeats would notice
  # a silent node first); one node of each job goes silent: its link is
  # deleted, which takes both ends (nothing it sends leaves it, no FIN or RST),
  # then its processes are killed. The jobs run side by side: each loss takes
  # ~30 s to find, by timers, and CCLITE_TIMEOUT is 300 s.
  #
  # start_job FIRST NAME STORE ARGS...: the job NAME on nodes FIRST, FIRST+1;
  # STORE "tcp": rank 0 (node FIRST) hosts the store; "file": a directory
  # every node sees (CCLITE_RDZV_DIR), which outlives any node. JOB_ENV: more
  # VAR=VALUE words for the ranks.
  JOB_ENV=
  start_job() {
    first=$1; name=$2; kind=$3; shift 3
    if [ "$kind" = tcp ]; then store="MASTER_ADDR=$(node_addr "$first") MASTER_PORT=29500"
    else store="CCLITE_RDZV_DIR=$LOGS/$name.rdzv"; fi
    for i in 0 1; do
      # shellcheck disable=SC2086
      node_run $((first + i)) "$LOGS/$name-node$((first + i)).log" env CCLITE_TIMEOUT=300 WORLD_SIZE=4 $store $JOB_ENV \
        sh -c 'n=$1; shift; RANK=$((n * 2)) LOCAL_RANK=0 "$0" "$@" & a=$!
          RANK=$((n * 2 + 1)) LOCAL_RANK=1 "$0" "$@" & b=$!
          wait $a; x=$?; wait $b; y=$?; echo "ranks exited $x $y"' "$BIN/collectives_check" "$i" "$@"
    done
  }
  # wait_lines PATTERN N: until the jobs' logs have N lines matching PATTERN.
  wait_lines() {
    n=0
    until [ "$(cat "$LOGS"/*.log 2>/dev/null | grep -c -- "$1")" = "$2" ]; do
      n=$((n + 1))
      [ "$n" -lt 300 ] || { fail "the jobs never got going"; finish; }
      sleep 0.2
    done
  }
  silence() {
    for v in "$@"; do
      ip -n "$(node_ns "$v")" link del eth0 || fail "cannot delete node $v's link"
      for p in $(ip netns pids "$(node_ns "$v")"); do kill -9 "$p" 2>/dev/null; done
    done
  }
  # survivors NAME O V CALL PATTERN [EACH]: node O's ranks (of job NAME) both
  # failed CALL with peer_lost, node V lost; one names it as PATTERN says (EACH:
  # both do: the job's first failure from the store's record, or, without a
  # store, through the shm link that the rank which found it closed).
  survivors() {
    name=$1; o=$2; v=$3; call=$4; pattern=$5; each=${6:-}
    node_wait "$o" 90
    eval "rc=\$NODE_RC_$o"
    echo "$name: node $v lost, node $o's ranks ended $(($(date +%s) - t0)) s later"
    [ "$rc" != 124 ] || fail "$name: node $o's ranks still ran 90 s after node $v was lost (CCLITE_TIMEOUT is 300 s)"
    log="$LOGS/$name-node$o.log"
    grep_log "$log" "ranks exited 1 1" "$name: both ranks of node $o failed"
    r=$(( (o > v) * 2 ))  # node O's first rank: 0 on the job's first node, 2 on its second
    for r in $r $((r + 1)); do
      grep_log "$log" "collectives_check: rank $r: $call failed: peer_lost: " "$name: rank $r fails with peer_lost"
      [ -z "$each" ] || grep_log "$log" "collectives_check: rank $r: $call failed: peer_lost: .*(node$v, pid [0-9]*)$pattern" \
        "$name: rank $r names node $v and why"
    done
    grep_log "$log" "$call failed: peer_lost: .*(node$v, pid [0-9]*)$pattern" "$name: a rank of node $o names node $v and why"
  }
  if [ "$CASE" = host_lost ]; then
    nodes_up 10
    # Mid-job: every collective, then allreduces until stopped. The first job
    # has a silent host lost after 8 s instead of 25 (CCLITE_TCP_KEEPALIVE).
    JOB_ENV=CCLITE_TCP_KEEPALIVE=8
    start_job 0 mid tcp --count 262144 --repeat 100000000
    JOB_ENV=
    start_job 2 mid_store tcp --count 262144 --repeat 100000000
    # Under cclite-run on nodes 6 and 7; node 6 hosts the agents' store and
    # goes silent: node 7's agent finds the store silent (its heartbeat's
    # set, bounded by --node-timeout) before its workers find their peers
    # silent (25 s), stops them and exits without asking the store again.
    for i in 6 7; do
      node_run "$i" "$LOGS/agents-node$i.log" env CCLITE_TIMEOUT=300 "$BIN/cclite-run" --nnodes 2 \
        --nproc-per-node 2 --rdzv-id "t$$" --rdzv-endpoint "$(node_addr 6):29400" --rdzv-timeout 60 \
        --node-timeout 10 --timeout 200 "$BIN/collectives_check" --count 65536 --repeat 100000000
    done
    # Ranks 0-2 on node 8 (the store's host, lost), 3-5 on node 9, the ring
    # forced: rank 4's two links are shm (ranks 3 and 5), so only the link
    # that the rank which found the loss closes can tell it why.
    for i in 0 1; do
      node_run $((8 + i)) "$LOGS/ring-node$((8 + i)).log" env CCLITE_TIMEOUT=300 WORLD_SIZE=6 \
        CCLITE_ALGO=allreduce:ring MASTER_ADDR="$(node_addr 8)" MASTER_PORT=29500 \
        sh -c 'n=$1; shift; for l in 0 1 2; do RANK=$((n * 3 + l)) LOCAL_RANK=$l "$0" "$@" & done; wait' \
        "$BIN/collectives_check" "$i" --count 262144 --repeat 100000000
    done
    wait_lines "iteration 1" 18
    sleep 1
    t0=$(date +%s)
    silence 1 2 6 8
    keepalive=" lost: no answer to keepalive probes or retransmissions for 25 s (host down or network cut; "
    node_wait 7 90  # first: it ends first (~11 s)
    echo "agents: node 6 lost, node 7's cclite-run ended $(($(date +%s) - t0)) s later"
    [ "$NODE_RC_7" = 1 ] || fail "agents: node 7's cclite-run exited $NODE_RC_7, wanted 1 (the store lost) within 90 s"
    grep_log "$LOGS/agents-node7.log" \
      "^cclite-run: lost the rendezvous store on host node6: .* is the cclite-run agent there stuck or overloaded?; stopping the 2 workers on this node" \
      "agents: node 7's cclite-run names the store's host and stops its workers"
    left=$(ip netns pids "$(node_ns 7)" | wc -l)
    [ "$left" = 0 ] || fail "agents: $left processes left on node 7 after its cclite-run exited"
    survivors mid 0 1 "allreduce (repeat)" "$(echo "$keepalive" | sed 's/for 25 s/for 8 s/')" each
    # The store's host: 3 s for the record, then the rank that found the loss
    # tells its node's other rank through their shm link as it closes it.
    survivors mid_store 3 2 "allreduce (repeat)" "$keepalive" each
    node_wait 9 90
    echo "ring: node 8 lost, node 9's ranks ended $(($(date +%s) - t0)) s later"
    for r in 3 4 5; do
      grep_log "$LOGS/ring-node9.log" "collectives_check: rank $r: allreduce (repeat) failed: peer_lost: .*(node8, pid [0-9]*)$keepalive" \
        "ring: rank $r names node 8 and why"
    done
    grep_log "$LOGS/ring-node9.log" "collectives_check: rank 4: .* failed and closed its shm link: " \
      "ring: rank 4 learns it through a closed shm link"
  else
    nodes_up 6
    # Before a first connection: after init (ring neighbours only), "ready",
    # then 4 s later a sendrecv with rank r + 2, on the other node.
    start_job 0 dial tcp --late-p2p    # node 0's ranks (lower) dial node 1's silent listeners
    start_job 2 accept file --late-p2p  # node 3's ranks wait for node 2's and probe its listeners
    start_job 4 nostore tcp --late-p2p  # the same, the store lost with node 4
    wait_lines ": ready$" 12
    t0=$(date +%s)
    silence 1 2 4
    survivors dial 0 1 sendrecv " at .*: no answer for [0-9]* s (last error: .*): the peer's host is down or the network is cut"
    survivors accept 3 2 sendrecv " will not connect: its host does not answer at "
    survivors nostore 5 4 sendrecv " will not connect: neither it nor the rendezvous store (which has its address) answers"
  fi
  ;;
elastic)
  nodes_up 3
  # The first attempt runs until killed; the restarted one checks and ends.
  prog='if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec "$0" --count 65536 --repeat 100000000; fi; exec "$0" --count 65536'
  i=0
  while [ "$i" -lt 3 ]; do
    node_run "$i" "$LOGS/node$i.log" env CCLITE_TIMEOUT=60 CCLITE_DEBUG=INFO "$BIN/cclite-run" --nnodes 2:3 \
      --nproc-per-node 1 --rdzv-id "t$$" --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 \
      --node-timeout 5 --rdzv-last-call 2 --max-restarts 1 --timeout 200 \
      /bin/sh -c "$prog" "$BIN/collectives_check"
    i=$((i + 1))
  done
  n=0
  until [ "$(cat "$LOGS"/node*.log 2>/dev/null | grep -c "iteration 1")" = 3 ]; do
    n=$((n + 1))
    [ "$n" -lt 300 ] || { fail "the job never got going"; finish; }
    sleep 0.2
  done
  # Any node but the store's host (node 0) may go; node 2 does.
  kill -9 "$NODE_PID_2"
  node_wait 0 150
  node_wait 1 30
  node_wait 2 5
  RC_0=$NODE_RC_0
  RC_1=$NODE_RC_1
  for i in 0 1; do
    f="$LOGS/node$i.log"
    grep_log "$f" "restarting the workers (restart 1 of 1)" "node $i restarted"
    grep_log "$f" "round 1" "node $i met the others again"
    grep_log "$f" "collectives_check: rank $i of 2 on node$i: [0-9]* checks passed" "node $i: the 2-node job passed"
    eval "rc=\$RC_$i"
    [ "$rc" = 0 ] || fail "node $i: cclite-run exited $rc"
  done
  ;;
elastic_grow)
  nodes_up 3
  # The 2-node job runs until the membership changes; the 3-node one checks and ends.
  prog='if [ "$WORLD_SIZE" = 2 ]; then exec "$0" --count 65536 --repeat 100000000; fi; exec "$0" --count 65536'
  grow() {
    node_run "$1" "$LOGS/node$1.log" env CCLITE_TIMEOUT=60 CCLITE_DEBUG=INFO "$BIN/cclite-run" --nnodes 2:3 \
      --nproc-per-node 1 --rdzv-id "g$$" --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 \
      --node-timeout 5 --rdzv-last-call 2 --timeout 200 /bin/sh -c "$prog" "$BIN/collectives_check"
  }
  grow 0
  grow 1
  n=0
  until [ "$(cat "$LOGS"/node*.log 2>/dev/null | grep -c "iteration 1")" = 2 ]; do
    n=$((n + 1))
    [ "$n" -lt 300 ] || { fail "the 2-node job never got going"; finish; }
    sleep 0.2
  done
  grow 2
  node_wait 0 150
  node_wait 1 30
  node_wait 2 30
  for i in 0 1 2; do
    f="$LOGS/node$i.log"
    grep_log "$f" "collectives_check: rank [0-2] of 3 on node$i: [0-9]* checks passed" "node $i: the 3-node job passed"
    eval "rc=\$NODE_RC_$i"
    [ "$rc" = 0 ] || fail "node $i: cclite-run exited $rc"
  done
  for i in 0 1; do
    grep_log "$LOGS/node$i.log" "a node is waiting to join (the job has 2 of at most 3 nodes)" "node $i saw the newcomer"
    grep_log "$LOGS/node$i.log" "not counted as a restart" "node $i restarted its workers for it"
  done
  grep_log "$LOGS/node2.log" "waiting for the running nodes to take it in" "node 2 waited for the next round"
  ;;
rdzv_id)
  nodes_up 2
  node_run 0 "$LOGS/node0.log" env CCLITE_TIMEOUT=60 "$BIN/cclite-run" --nnodes 2 --rdzv-id "job$$" \
    --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --timeout 120 "$BIN/collectives_check" --count 4096
  node_run 1 "$LOGS/other.log" "$BIN/cclite-run" --nnodes 2 --rdzv-id "other$$" \
    --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --timeout 60 /bin/true
  node_wait 1 90
  [ "$NODE_RC_1" = 1 ] || fail "the other job's agent exited $NODE_RC_1, wanted 1"
  grep_log "$LOGS/other.log" "belongs to job 'job$$' but this agent was started with --rdzv-id other$$" "the refusal names both ids"
  node_run 1 "$LOGS/node1.log" env CCLITE_TIMEOUT=60 "$BIN/cclite-run" --nnodes 2 --rdzv-id "job$$" \
    --rdzv-endpoint "$(node_addr 0):29400" --rdzv-timeout 60 --timeout 120 "$BIN/collectives_check" --count 4096
  node_wait 0 150
  node_wait 1 30
  RC_0=$NODE_RC_0
  RC_1=$NODE_RC_1
  check_collectives 2 1
  ;;
srun)
  nodes_up 2
  nodes_hosts  # node0 resolves its own name to 127.0.1.1, as on a Debian node
  # What slurmstepd gives each task (there is no Slurm here); two tasks per node.
  i=0
  while [ "$i" -lt 2 ]; do
    node_run "$i" "$LOGS/node$i.log" env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT \
      -u CCLITE_RDZV_ENDPOINT -u CCLITE_RDZV_DIR CCLITE_DEBUG=INFO CCLITE_TIMEOUT=60 \
      SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID="$$" SLURM_STEP_ID=0 SLURM_NODEID="$i" \
      SLURM_JOB_NODELIST="node[0-1]" SLURM_STEP_NODELIST="node[0-1]" SLURMD_NODENAME="node$i" \
      sh -c 'SLURM_PROCID=$(($1 * 2)) SLURM_LOCALID=0 "$0" --count 65536 & a=$!
             SLURM_PROCID=$(($1 * 2 + 1)) SLURM_LOCALID=1 "$0" --count 65536 & b=$!
             wait $a; x=$?; wait $b; y=$?; [ $x = 0 ] && [ $y = 0 ]' "$BIN/collectives_check" "$i"
    i=$((i + 1))
  done
  node_wait 0 150
  node_wait 1 30
  RC_0=$NODE_RC_0
  RC_1=$NODE_RC_1
  check_collectives 2 2
  grep_log "$LOGS/node0.log" "rendezvous store listening on $(node_addr 0), 127.0.1.1 port [0-9]* (.*srun: the first node of SLURM_STEP_NODELIST='node\[0-1\]' and a port from SLURM_JOB_ID.SLURM_STEP_ID)" \
    "rank 0 hosts the store on node0 (its interface and the loopback its name resolves to), at the derived port"
  for i in 0 1; do
    grep_log "$LOGS/node$i.log" "(node$((1 - i)), pid [0-9]*): via tcp" "node $i: tcp to the other node"
    grep_log "$LOGS/node$i.log" "(node$i, pid [0-9]*): via shm" "node $i: shm inside the node"
  done
  ;;
srun_agents)
  nodes_up 2
  nodes_hosts
  i=0
  while [ "$i" -lt 2 ]; do
    node_run "$i" "$LOGS/node$i.log" env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT \
      -u CCLITE_RDZV_ENDPOINT -u CCLITE_RDZV_DIR CCLITE_DEBUG=INFO CCLITE_TIMEOUT=60 \
      SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=1 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=2 \
      SLURM_JOB_ID="$$" SLURM_STEP_ID=1 SLURM_NODEID="$i" SLURM_PROCID="$i" SLURM_LOCALID=0 \
      SLURM_JOB_NODELIST="node[0-1]" SLURM_STEP_NODELIST="node[0-1]" SLURMD_NODENAME="node$i" \
      "$BIN/cclite-run" --nproc-per-node 2 --rdzv-timeout 60 --timeout 120 "$BIN/collectives_check" --count 65536
    i=$((i + 1))
  done
  node_wait 0 150
  node_wait 1 30
  RC_0=$NODE_RC_0
  RC_1=$NODE_RC_1
  check_collectives 2 2
  for i in 0 1; do
    grep_log "$LOGS/node$i.log" "srun: 2 nodes meet at node0:[0-9]*, the first node of SLURM_STEP_NODELIST='node\[0-1\]'" \
      "node $i: the agents' endpoint derived from the step"
  done
  ;;
trace_request)
  nodes_up 2
  run_job 2 2 120 CCLITE_TRACE_BUFFER=16 "CCLITE_TRACE_FILE=$LOGS/t." -- "$BIN/collectives_check" --stuck-rank1
  [ "$RC_1" = 2 ] || fail "node 1: cclite-run exited $RC_1, not 2 (rank 3's status)"
  [ "$RC_0" = 2 ] || fail "node 0: cclite-run exited $RC_0, not 2 (the job's first failure)"
  # Rank 0 may have lost rank 3 and failed by itself first: then only rank 1 is asked.
  grep_log "$LOGS/node0.log" "flight recorder: asked rank.* 1 for" "node 0 asked rank 1 (computing) for its file"
  if grep -q "flight recorder: no file from" "$LOGS/node0.log" "$LOGS/node1.log"; then fail "an asked worker wrote no file"; fi
  "$BIN/cclite-trace" "$LOGS"/t.* >"$LOGS/report.log" 2>&1 || fail "cclite-trace failed"
  grep_log "$LOGS/report.log" "rank 1 never started collective #2; its last was allreduce #1 (1000 x float, sum), done in" \
    "the report names rank 1's last call"
  grep_log "$LOGS/report.log" "node0 pid [0-9]*: SIGUSR1: a dump on request" "rank 1's file was written on request"
  # Rank 0's file: its failure's or the requested one, never emptied by a
  # request that came as its communicator was gone.
  grep_log "$LOGS/report.log" "(id [0-9a-f]*, 4 ranks): files from ranks 0-2; none from rank 3" "a file from ranks 0-2"
  ;;
*)
  echo "usage: $0 2x2|3x1|hostnames|ifname|ifname_auto|ifname_wrong|agent_killed|host_lost|host_lost_connect|elastic|rdzv_id|srun|srun_agents|trace_request"
  exit 2
  ;;
esac
finish
