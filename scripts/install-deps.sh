#!/bin/sh
# Installs what building and testing cclite needs on Debian 12 / Ubuntu 22.04+.
# Runs apt-get as root, or through sudo when started as another user.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# g++/cmake: build; libasio-dev: TCP store (standalone Asio); doctest-dev: tests.
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake libasio-dev doctest-dev ca-certificates >/dev/null
echo "install-deps: done"
