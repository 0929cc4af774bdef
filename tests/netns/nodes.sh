# tests/netns/nodes.sh - simulated nodes for multi-node tests (POSIX sh, sourced).
#
# Each "node" is a network namespace with its own hostname (unshare --uts in
# node_run) and one address per network, on a bridge per network via a veth
# pair:
#
#   node i, network j:  interface eth<j> = 10.<90+j>.<run>.<i+1>/24  (run: this script's pid % 250)
#   bridge <prefix>b<j> in the root namespace, no address (nothing else reaches it)
#
# Names carry this shell's pid, so parallel runs never collide. Everything is
# torn down by nodes_down, which nodes_up arms as an EXIT/INT/TERM trap: the
# processes inside our namespaces (ours only: nothing else lives there) are
# SIGKILLed, then the namespaces and bridges are deleted.
#
#   . tests/netns/nodes.sh
#   nodes_require            # exit 77 (skip) with the reason when not root / no ip netns
#   nodes_up 2 [NETS]        # 2 nodes, NETS networks each (default 1)
#   nodes_rate 10gbit        # optional: tbf on every node's eth0 egress
#   node_run 0 LOG cmd...    # background; pid in NODE_PID_0
#   node_addr 0 [NET]        # prints 10.90.R.1
#   node_wait 0 SECONDS      # waits for node 0's command; its status in NODE_RC_0 (124: timed out)
#   nodes_hosts              # optional: /etc/hosts per node naming every node nodeI, and
#                            # itself 127.0.1.1 as Debian's installer does

NODES_PREFIX="cn$$"
NODES_K=0
NODES_NETS=1
NODES_RUN=$(( $$ % 250 ))

nodes_skip() {
  echo "SKIP: $*"
  exit 77
}

nodes_require() {
  [ "$(id -u)" = 0 ] || nodes_skip "simulated nodes need root (network namespaces, veth, bridges)"
  command -v ip >/dev/null 2>&1 || nodes_skip "'ip' (iproute2) is not installed"
  command -v unshare >/dev/null 2>&1 || nodes_skip "'unshare' (util-linux) is not installed"
  ip netns add "${NODES_PREFIX}probe" 2>/dev/null || nodes_skip "'ip netns add' failed (no network namespaces here?)"
  ip netns del "${NODES_PREFIX}probe"
  ip link add "${NODES_PREFIX}pb" type bridge 2>/dev/null || nodes_skip "cannot create a bridge (no bridge module?)"
  ip link del "${NODES_PREFIX}pb"
}

nodes_down() {
  trap - EXIT INT TERM
  i=0
  while [ "$i" -lt "$NODES_K" ]; do
    ns="${NODES_PREFIX}n$i"
    if ip netns list 2>/dev/null | grep -q "^$ns\b"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
      # The veths first: a deleted namespace frees its devices later, in the
      # background, and a nodes_up right after would find the names taken.
      j=0
      while [ "$j" -lt "$NODES_NETS" ]; do
        ip link del "${NODES_PREFIX}v$i$j" 2>/dev/null
        j=$((j + 1))
      done
      ip netns del "$ns" 2>/dev/null
    fi
    rm -rf "/etc/netns/$ns"
    i=$((i + 1))
  done
  rmdir /etc/netns 2>/dev/null  # only when no other run's files are there
  j=0
  while [ "$j" -lt "$NODES_NETS" ]; do
    ip link del "${NODES_PREFIX}b$j" 2>/dev/null
    j=$((j + 1))
  done
  return 0
}

nodes_fail() {
  echo "nodes.sh: $*" >&2
  exit 1
}

nodes_up() {
  NODES_K=$1
  NODES_NETS=${2:-1}
  trap 'nodes_down' EXIT
  trap 'nodes_down; exit 130' INT
  trap 'nodes_down; exit 143' TERM
  j=0
  while [ "$j" -lt "$NODES_NETS" ]; do
    ip link add "${NODES_PREFIX}b$j" type bridge || nodes_fail "cannot create bridge ${NODES_PREFIX}b$j"
    ip link set "${NODES_PREFIX}b$j" up
    j=$((j + 1))
  done
  i=0
  while [ "$i" -lt "$NODES_K" ]; do
    ns="${NODES_PREFIX}n$i"
    ip netns add "$ns" || nodes_fail "cannot create namespace $ns"
    ip -n "$ns" link set lo up
    j=0
    while [ "$j" -lt "$NODES_NETS" ]; do
      host_end="${NODES_PREFIX}v$i$j"
      ip link add "$host_end" type veth peer name "${NODES_PREFIX}p$i$j" || nodes_fail "cannot create veth $host_end"
      ip link set "${NODES_PREFIX}p$i$j" netns "$ns"
      ip -n "$ns" link set "${NODES_PREFIX}p$i$j" name "eth$j"
      ip -n "$ns" addr add "$(node_addr "$i" "$j")/24" dev "eth$j"
      ip -n "$ns" link set "eth$j" up
      ip link set "$host_end" master "${NODES_PREFIX}b$j"
      ip link set "$host_end" up
      j=$((j + 1))
    done
    i=$((i + 1))
  done
  # No readiness wait: a bridge without STP forwards at once, and every
  # connection cclite makes is retried until its deadline anyway.
}

# `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: each node
# resolves the others' names to their eth0 addresses, and its own name to
# 127.0.1.1 (a Debian install's /etc/hosts), the case that trips launchers.
nodes_hosts() {
  i=0
  while [ "$i" -lt "$NODES_K" ]; do
    d="/etc/netns/$(node_ns "$i")"
    mkdir -p "$d" || nodes_fail "cannot create $d"
    {
      echo "127.0.0.1 localhost"
      echo "127.0.1.1 node$i"
      k=0
      while [ "$k" -lt "$NODES_K" ]; do
        [ "$k" = "$i" ] || echo "$(node_addr "$k") node$k"
        k=$((k + 1))
      done
    } >"$d/hosts"
    i=$((i + 1))
  done
}

node_addr() {
  echo "10.$((90 + ${2:-0})).$NODES_RUN.$(($1 + 1))"
}

node_ns() {
  echo "${NODES_PREFIX}n$1"
}

# rate_bytes RATE: bytes per second of a tc rate ("10gbit", "1gbit", "500mbit").
rate_bytes() {
  echo "$1" | awk '{ r = $1; u = r; sub(/[0-9.]+/, "", u); v = r + 0;
    m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; printf "%.0f", v * m / 8 }'
}

# Rate-limits every node's eth0 egress with a token bucket (tbf is in every
# kernel; netem is not). The burst is 10 ms at RATE, at least 4 MiB: tbf needs
# at least RATE/HZ (5 MB at 10 Gbit/s and HZ=250), or the qdisc itself caps the
# rate. Sets NODES_BURST (bytes).
nodes_rate() {
  NODES_BURST=$(rate_bytes "$1" | awk '{ b = $1 / 100; if (b < 4194304) b = 4194304; printf "%d", b }')
  i=0
  while [ "$i" -lt "$NODES_K" ]; do
    ip netns exec "$(node_ns "$i")" tc qdisc replace dev eth0 root tbf rate "$1" burst "$NODES_BURST" latency 50ms ||
      nodes_fail "tc tbf on node $i failed"
    i=$((i + 1))
  done
}

# node_run I LOG CMD...: runs CMD on node I (hostname node<I>), output to LOG, in the background.
node_run() {
  i=$1
  log=$2
  shift 2
  ip netns exec "$(node_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$i" "$@" >"$log" 2>&1 &
  eval "NODE_PID_$i=$!"
}

# node_wait I SECONDS: waits for node I's command; sets NODE_RC_<I> (124 when it outlived SECONDS and was killed).
node_wait() {
  eval "p=\$NODE_PID_$1"
  t=0
  while kill -0 "$p" 2>/dev/null; do
    # reaped children disappear from kill -0 only after wait; check the state
    if [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" = Z ]; then break; fi
    t=$((t + 1))
    if [ "$t" -gt $(($2 * 5)) ]; then
      kill -9 "$p" 2>/dev/null
      wait "$p" 2>/dev/null
      eval "NODE_RC_$1=124"
      return 0
    fi
    sleep 0.2
  done
  wait "$p"
  eval "NODE_RC_$1=$?"
}
