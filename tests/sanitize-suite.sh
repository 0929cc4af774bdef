#!/usr/bin/env bash
# tests/sanitize-suite.sh - the whole test suite under a sanitizer, by hand.
#
#   tests/sanitize-suite.sh [address,undefined | thread] [BUILD_DIR]
#
# CI runs only fault_test under ASan+UBSan and TSan (tests/sanitizers.cmake:
# building every test instrumented would not fit its budget). This builds
# every test program of this tree instrumented (-O1 -g; CCLITE_SANITIZE
# instruments the test programs, not the tools or samples they start) in
# BUILD_DIR (default /tmp/cclite-san-<name>) and runs ctest there; every
# report halts its process, so any report is a failed test. Here (2 cores)
# the ASan+UBSan run took ~20 min to build and ~9 min to run (Session 24);
# the TSan run ~18 min to build and ~35 min to run (Session 41: 78/78, no
# report; device_comm_emulated and its async twin 747 s each, fault_verbs_emulated
# 395 s, collective_test 117 s).
#
# Expected failures that are not findings:
#   - torchrun_launch_torch2 runs the instrumented collectives_check inside the
#     Debian 13 root of scripts/torch2-root.sh, which has no libasan/libtsan;
#     it is left out (-E).
#   - the GPU tests skip without a device, as in the ordinary build.
#   - under TSan, allreduce_test's matrix (every dtype, op and size up to MiBs
#     on 1-8 ranks) did not finish in 30 min here (Session 27: no case had
#     failed or hit its hang guard when ctest stopped it); it is left out
#     there, its paths run in collective_test, fault_test and the ASan run.
set -euo pipefail
san=${1:-address,undefined}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${2:-/tmp/cclite-san-${san//,/-}}
case $san in
  *thread*) opts=(TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1) ;;
  *) opts=(ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1
           UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1) ;;
esac
cmake -S "$root" -B "$bin" -DCCLITE_SANITIZE="$san" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" -DCCLITE_SANITIZE_TESTS=OFF \
  -DCCLITE_EMBEDDED_TESTS=OFF -DCCLITE_HEADER_CHECK=OFF -DCCLITE_TEST_TIMEOUT=1800 >/dev/null
cmake --build "$bin" -j2
skip='^torchrun_launch_torch2$'
case $san in *thread*) skip="$skip|^allreduce_test$" ;; esac
env "${opts[@]}" ctest --test-dir "$bin" --output-on-failure -j2 -E "$skip"
