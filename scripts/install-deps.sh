#!/bin/sh
# Installs what building and testing cclite needs on Debian 12 / Ubuntu 22.04+.
# Runs apt-get as root, or through sudo when started as another user.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# g++/cmake: build; doctest-dev: tests;
# libopenblas-dev: cclite::train's matrix products; zlib1g-dev + dataset-fashion-mnist:
# the sample trainer (samples/train_fashion_mnist.cpp) and its test.
# g++-aarch64-linux-gnu + qemu-user-static: the aarch64 cross build, run under
# qemu-user (tests/embedded.cmake; the test is skipped without them).
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake doctest-dev ca-certificates \
  libopenblas-dev zlib1g-dev dataset-fashion-mnist \
  g++-aarch64-linux-gnu qemu-user-static >/dev/null
# clang + its libFuzzer/sanitizer runtime: the fuzz tests (tests/fuzz/; skipped
# without). Debian 12 ships the runtime as libclang-rt-NN-dev, only recommended by
# clang, so it is named; older releases keep it inside clang's own packages.
$SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null
CLANG_MAJOR=$(clang++ --version 2>/dev/null | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n 1)
if [ -n "$CLANG_MAJOR" ] && apt-cache show "libclang-rt-$CLANG_MAJOR-dev" >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends "libclang-rt-$CLANG_MAJOR-dev" >/dev/null
fi
# libibverbs-dev (rdma-core): the InfiniBand/RoCE verbs transport (transports/verbs;
# without it cclite::verbs is not built and verbs_test is skipped).
$SUDO apt-get install -y -qq --no-install-recommends libibverbs-dev >/dev/null
# openmpi-bin: the mpirun launch test (tests/netns/mpirun_test.sh); libopenmpi-dev:
# bench/'s allreduce_perf_mpi (openmpi-bin alone ships the mpicxx wrapper without
# mpi.h, which makes CMake's FindMPI fail); iproute2: the simulated nodes of
# tests/netns/ (ip netns, veth, bridge, tc; root only). Tests needing them are
# skipped without them.
$SUDO apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev iproute2 >/dev/null
# python3-torch: a real torchrun for the torchrun launch test (tests/netns/torchrun_test.sh;
# skipped without it). Large (~150 MB), and only the test uses it: cclite needs no Python.
$SUDO apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
# A Debian 13 root with torch 2.x's torchrun for tests/netns/torchrun_torch2.sh (about
# 1 GB in /var/tmp/cclite-torch2, a few minutes; root only: debootstrap and chroot).
# Not fatal: without it that one test is skipped and says how to make the root.
# CCLITE_NO_TORCH2_ROOT=1 leaves it out.
if [ "$(id -u)" -eq 0 ] && [ "${CCLITE_NO_TORCH2_ROOT:-0}" != 1 ]; then
  "$(dirname "$0")/torch2-root.sh" ||
    echo "install-deps: no torch 2.x root (above); ctest torchrun_launch_torch2 will be skipped"
fi
echo "install-deps: done"
