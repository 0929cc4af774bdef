#!/bin/sh
# tests/netns/torchrun_torch2.sh - torchrun_test.sh again, under the torch 2.x
# torchrun of a Debian 13 root (scripts/torch2-root.sh builds it), with the
# cclite binaries built here (Debian 12's glibc and libstdc++ are older, so
# they run there unchanged).
#
# torch 2.x speaks the other dialect of the c10d store protocol (a validate
# query first, every query type renumbered), and from torch 2.4 its agent
# hosts the store under --standalone too: every case of torchrun_test.sh runs
# against that real server, not against tests/support/fake_c10d.hpp.
#
# Runs as root in a mount namespace of its own (so no mount outlives it): the
# root gets /proc, /sys, /dev, /dev/shm, this machine's /etc/hosts, and this
# source tree and CCLITE_BIN_DIR at their own paths. USE_LIBUV=0: Debian's
# torch has no libuv (see scripts/torch2-root.sh); the torch.distributed
# program of case 4 reads its store's backend from it.
# Exit 0 pass, 1 fail, 77 skipped (not root, or no root: the reason says how
# to make one).
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
BIN=$(cd "${CCLITE_BIN_DIR:-build/bin}" && pwd)
ROOT=${CCLITE_TORCH2_ROOT:-/var/tmp/cclite-torch2}
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (chroot, mounts)"; exit 77; }
[ -f "$ROOT/.cclite-torch2" ] ||
  { echo "SKIP: no torch 2.x root at $ROOT: make one with 'sudo scripts/torch2-root.sh $ROOT' (~1 GB, a few minutes)"; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "SKIP: 'unshare' (util-linux) is not installed"; exit 77; }
echo "torch 2.x root: $ROOT ($(cat "$ROOT/.cclite-torch2"))"

exec unshare --mount --propagation private sh -c '
  R=$1 SRC=$2 BIN=$3
  set -e
  # R on itself: "ip netns exec" (the two-node case) remounts / inside R.
  mount --bind "$R" "$R"
  mount -t proc proc "$R/proc"
  mount -t sysfs sys "$R/sys"
  mount --rbind /dev "$R/dev"  # with /dev/shm (the shm transport) and /dev/pts
  mount --bind /etc/hosts "$R/etc/hosts"
  for d in "$SRC" "$BIN"; do mkdir -p "$R$d" && mount --bind "$d" "$R$d"; done
  set +e
  exec chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USE_LIBUV=0 \
    CCLITE_BIN_DIR="$BIN" sh "$SRC/tests/netns/torchrun_test.sh"' \
  torchrun_torch2 "$ROOT" "$SRC" "$BIN"
