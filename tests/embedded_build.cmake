# cmake -P script behind the embedded_* tests (tests/embedded.cmake): configures
# this source tree into its own build directory with other flags or another
# compiler, builds a few targets there, runs some of that build's tests with its
# ctest, then runs sample programs as real multi-process jobs through the host's
# cclite-run.
#
#   -DSOURCE_DIR=  -DBINARY_DIR=  -DGENERATOR=  -DMAKE_PROGRAM=
#   -DCXX_COMPILER=        native builds: the outer build's compiler
#   -DTOOLCHAIN=           cross builds: a cmake/toolchains/ file
#   -DCXX_FLAGS=           CMAKE_CXX_FLAGS of the sub-build
#   -DBUILD_TYPE=          CMAKE_BUILD_TYPE of the sub-build (None: no -O flag)
#   -DTARGETS=a|b|c        what to build
#   -DTESTS=regex          which of the sub-build's tests ctest runs (empty: none)
#   -DRUNNER=              the host's cclite-run
#   -DRUNS=prog:np:env|... programs of the sub-build's bin/ to run with cclite-run
#                          (env: one VAR=VALUE, or - for none)
#   -DREQUIRE=p|q          programs that must be on PATH, else the test is
#                          skipped with the reason (ctest SKIP_REGULAR_EXPRESSION)
#   -DEMULATOR_NAME=       run programs through this (qemu-aarch64-static)
cmake_minimum_required(VERSION 3.24)

string(REPLACE "|" ";" _targets "${TARGETS}")
string(REPLACE "|" ";" _runs "${RUNS}")
string(REPLACE "|" ";" _require "${REQUIRE}")

foreach(p IN LISTS _require)
  find_program(_found_${p} ${p})
  if(NOT _found_${p})
    message("EMBEDDED-SKIP: ${p} is not installed, so this cross test cannot run "
            "(scripts/install-deps.sh installs g++-aarch64-linux-gnu and qemu-user-static)")
    return()
  endif()
endforeach()

set(_emu "")
if(EMULATOR_NAME)
  find_program(_emu_path ${EMULATOR_NAME} REQUIRED)
  set(_emu "${_emu_path}")
endif()

# ---- configure -------------------------------------------------------------------
set(_args -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
  -DCCLITE_BUILD_BENCH=OFF -DCCLITE_INSTALL=OFF -DCCLITE_HEADER_CHECK=OFF
  -DCCLITE_EMBEDDED_TESTS=OFF -DCCLITE_WITH_BLAS=OFF
  # Optional parts this build does not test: skip their detection (nvcc alone
  # costs ~10 s of configure) and their test registrations.
  -DCCLITE_WITH_CUDA=OFF -DCCLITE_WITH_NCCL=OFF -DCCLITE_WITH_VERBS=OFF -DCCLITE_SANITIZE_TESTS=OFF
  # A few test programs: the precompiled header would cost more than it saves.
  -DCCLITE_TEST_PCH=OFF)
if(MAKE_PROGRAM)
  list(APPEND _args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(TOOLCHAIN)
  list(APPEND _args "--toolchain" "${TOOLCHAIN}")
elseif(CXX_COMPILER)
  list(APPEND _args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
string(TIMESTAMP _t0 "%s")
execute_process(COMMAND ${CMAKE_COMMAND} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed (${rc}):\n${out}")
endif()

# ---- build -----------------------------------------------------------------------
execute_process(COMMAND ${CMAKE_COMMAND} --build "${BINARY_DIR}" -j2 --target ${_targets}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build failed (${rc}):\n${out}")
endif()
string(TIMESTAMP _t1 "%s")
math(EXPR _tb "${_t1} - ${_t0}")
message("configured and built ${TARGETS} in ${_tb} s")

# ---- the sub-build's own tests (through CMAKE_CROSSCOMPILING_EMULATOR if cross) ----
if(TESTS)
  execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir "${BINARY_DIR}" -R "${TESTS}"
                          --output-on-failure --no-tests=error
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tests failed in ${BINARY_DIR}")
  endif()
endif()

# ---- multi-process runs of the sub-build's programs ---------------------------------
# QEMU_LD_PREFIX: a static glibc program still loads the target's NSS modules
# (host name lookups); qemu finds them under the cross sysroot.
foreach(run IN LISTS _runs)
  string(REPLACE ":" ";" r "${run}")
  list(GET r 0 prog)
  list(GET r 1 np)
  list(GET r 2 env)
  set(_env "")
  if(NOT env STREQUAL "-")
    list(APPEND _env "${env}")
  endif()
  if(TOOLCHAIN AND EMULATOR_NAME MATCHES "qemu-([a-z0-9_]+)-static")
    if(CMAKE_MATCH_1 STREQUAL "arm")
      list(APPEND _env "QEMU_LD_PREFIX=/usr/arm-linux-gnueabihf")
    else()
      list(APPEND _env "QEMU_LD_PREFIX=/usr/${CMAKE_MATCH_1}-linux-gnu")
    endif()
  endif()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ${_env}
            "${RUNNER}" --timeout 240 --nproc-per-node ${np} ${_emu} "${BINARY_DIR}/bin/${prog}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${prog}, ${np} ranks, ${env}:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${prog} (${np} ranks, ${env}) failed (${rc})")
  endif()
endforeach()
string(TIMESTAMP _t2 "%s")
math(EXPR _tt "${_t2} - ${_t1}")
message("tests and runs took ${_tt} s")
