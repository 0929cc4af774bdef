# Cross-compiling cclite for 64-bit ARM Linux with Debian's cross compiler
# (apt-get install g++-aarch64-linux-gnu; scripts/install-deps.sh installs it):
#
#   cmake -S . -B build-aarch64 --toolchain cmake/toolchains/aarch64-linux-gnu.cmake
#
# Executables are linked statically (CCLITE_CROSS_STATIC, default ON) so they
# run on a board without matching shared libraries, and here under qemu-user:
# when qemu-aarch64-static (Debian's qemu-user-static) is found it becomes
# CMAKE_CROSSCOMPILING_EMULATOR, so ctest runs the tests through it.
# tests/embedded.cmake drives this toolchain in CI.
set(CCLITE_CROSS_TRIPLE aarch64-linux-gnu)
set(CCLITE_CROSS_QEMU qemu-aarch64-static)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross-common.cmake)
