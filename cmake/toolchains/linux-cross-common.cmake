# Shared part of the Debian cross toolchain files in this folder. The caller
# sets CCLITE_CROSS_TRIPLE (aarch64-linux-gnu, ...), CCLITE_CROSS_QEMU and
# CMAKE_SYSTEM_PROCESSOR.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_CXX_COMPILER ${CCLITE_CROSS_TRIPLE}-g++)
set(CMAKE_C_COMPILER ${CCLITE_CROSS_TRIPLE}-gcc)

# Libraries come from the target's sysroot; headers and CMake packages may also
# come from the build machine: doctest is header-only and the same
# for every architecture (/usr/include, /usr/lib/cmake).
set(CMAKE_FIND_ROOT_PATH /usr/${CCLITE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

option(CCLITE_CROSS_STATIC "Link executables statically (runs on any board, and under qemu-user)" ON)
if(CCLITE_CROSS_STATIC)
  set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
endif()

find_program(CCLITE_CROSS_EMULATOR ${CCLITE_CROSS_QEMU})
if(CCLITE_CROSS_EMULATOR)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CCLITE_CROSS_EMULATOR})
endif()
