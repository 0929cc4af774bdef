# Cross-compiling cclite for 32-bit ARM Linux (armhf) with Debian's cross
# compiler (apt-get install g++-arm-linux-gnueabihf), run here under
# qemu-arm-static. Same conventions as aarch64-linux-gnu.cmake.
set(CCLITE_CROSS_TRIPLE arm-linux-gnueabihf)
set(CCLITE_CROSS_QEMU qemu-arm-static)
set(CMAKE_SYSTEM_PROCESSOR arm)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross-common.cmake)
