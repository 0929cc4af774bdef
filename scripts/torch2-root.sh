#!/bin/sh
# scripts/torch2-root.sh [DIR] - a Debian 13 (trixie) root holding python3-torch
# 2.x, for tests/netns/torchrun_torch2.sh: the torchrun test run against a
# torch 2.x launcher (the host's Debian 12 ships torch 1.13).
#
# DIR defaults to $CCLITE_TORCH2_ROOT, else /var/tmp/cclite-torch2 (about 1 GB;
# keep it out of the source and build trees). Root only (debootstrap, chroot).
# Idempotent: a finished root (DIR/.cclite-torch2) is left as it is.
#
# One patch, inside DIR only: Debian builds torch without libuv, while torch
# >= 2.4's torchrun asks every TCPStore for libuv and so fails before starting
# a worker ("use_libuv was requested but PyTorch was build without libuv
# support", pytorch/pytorch#148283; not cclite's). Where that is so, the three
# TCPStore calls of torchrun's rendezvous get use_libuv=False, i.e. the classic
# TCPStore server that a pip-installed torch runs with USE_LIBUV=0.
set -eu
DIR=${1:-${CCLITE_TORCH2_ROOT:-/var/tmp/cclite-torch2}}
MIRROR=${CCLITE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# trixie (Debian 13, stable: torch 2.6) for CI; sid (unstable) has the newest torch.
SUITE=${CCLITE_TORCH2_SUITE:-trixie}
[ -f "$DIR/.cclite-torch2" ] && { echo "torch2-root: $DIR is ready ($(cat "$DIR/.cclite-torch2"))"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "torch2-root: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null 2>&1 ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
command -v unshare >/dev/null 2>&1 || { echo "torch2-root: needs unshare (util-linux)" >&2; exit 1; }

mkdir -p "$DIR"
if [ ! -x "$DIR/usr/bin/apt-get" ]; then
  echo "torch2-root: debootstrap $SUITE into $DIR (a few minutes)"
  debootstrap --variant=minbase "$SUITE" "$DIR" "$MIRROR" >"$DIR.debootstrap.log" 2>&1 ||
    { tail -n 20 "$DIR.debootstrap.log" >&2; echo "torch2-root: debootstrap failed (log: $DIR.debootstrap.log)" >&2; exit 1; }
  rm -f "$DIR.debootstrap.log"
fi
cp /etc/resolv.conf "$DIR/etc/resolv.conf" 2>/dev/null || true

# in_root CMD: CMD in DIR with /proc, /sys and /dev, in a mount namespace of its
# own, so no mount outlives the command.
in_root() {
  unshare --mount --propagation private sh -c '
    R=$1; shift
    mount -t proc proc "$R/proc" && mount -t sysfs sys "$R/sys" && mount --rbind /dev "$R/dev" &&
      exec chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"' \
    in_root "$DIR" "$@"
}
echo "torch2-root: installing python3-torch in $DIR"
# Check-Valid-Until=false: sid's Release file is valid for a week, and a mirror
# snapshot older than that is refused otherwise (signatures are still checked).
in_root sh -c 'apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq --no-install-recommends python3-torch iproute2 procps >/dev/null' ||
  { echo "torch2-root: installing python3-torch in $DIR failed; remove $DIR to start over" >&2; exit 1; }

if ! in_root python3 -c 'import torch.distributed as d; d.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)' 2>/dev/null; then
  rdzv=$DIR/usr/lib/python3/dist-packages/torch/distributed/elastic/rendezvous
  sed -i 's/^\( *\)multi_tenant=True,$/\1multi_tenant=True, use_libuv=False,  # cclite torch2-root.sh/' \
    "$rdzv/static_tcp_rendezvous.py" "$rdzv/c10d_rendezvous_backend.py" "$rdzv/dynamic_rendezvous.py"
  n=$(cat "$rdzv/static_tcp_rendezvous.py" "$rdzv/c10d_rendezvous_backend.py" "$rdzv/dynamic_rendezvous.py" |
    grep -c 'use_libuv=False,  # cclite torch2-root.sh' || true)
  [ "$n" = 3 ] || { echo "torch2-root: expected 3 TCPStore calls to patch in $rdzv, found $n" >&2; exit 1; }
  echo "torch2-root: torch without libuv: torchrun's 3 TCPStore calls patched to use_libuv=False"
fi
version=$(in_root python3 -c 'import torch; print(torch.__version__)')
echo "torch $version, Debian $(cat "$DIR/etc/debian_version")" >"$DIR/.cclite-torch2"
echo "torch2-root: $DIR is ready ($(cat "$DIR/.cclite-torch2"))"
