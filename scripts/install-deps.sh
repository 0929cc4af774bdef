#!/bin/sh
# Installs what building and testing cclite needs on Debian 12 / Ubuntu 22.04+.
# Runs apt-get as root, or through sudo when started as another user.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# g++/cmake: build; libasio-dev: TCP store (standalone Asio); doctest-dev: tests;
# libopenblas-dev: cclite::train's matrix products; zlib1g-dev + dataset-fashion-mnist:
# the sample trainer (samples/train_fashion_mnist.cpp) and its test.
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake libasio-dev doctest-dev ca-certificates \
  libopenblas-dev zlib1g-dev dataset-fashion-mnist >/dev/null
echo "install-deps: done"
