#!/bin/sh
# Installs what bench/compare.sh and bench/plot.sh need beyond scripts/install-deps.sh,
# on Debian 12 / Ubuntu 22.04+: Open MPI (mpirun, and the headers and libraries that
# let CMake build build/bin/allreduce_perf_mpi; re-run cmake afterwards), gnuplot
# without X (PNG output) and python3 (both scripts read the JSON lines with it).
# Runs apt-get as root, or through sudo when started as another user.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  openmpi-bin libopenmpi-dev gnuplot-nox python3 >/dev/null
echo "install-bench-deps: done (now: cmake -S . -B build && cmake --build build -j2)"
