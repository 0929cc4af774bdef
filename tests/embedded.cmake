# Embedded configurations (label "embedded"; `ctest -L embedded`), issue 8:
#
#   edge_sensor_average_3ranks  samples/edge_sensor_average (communicator<tcp>
#                               only) as 3 processes on loopback via cclite-run
#   embedded_no_exceptions      this tree again, with -fno-exceptions -fno-rtti
#                               -fno-asynchronous-unwind-tables (no .eh_frame, as
#                               firmware builds), in build/tests/embedded/noexcept: the core, shm,
#                               tcp and launcher tests, cclite-run and the samples
#                               build; unit, shm, tcp and launcher tests run, and
#                               hello_allreduce (shm, tcp) and edge_sensor_average
#                               run as real jobs
#   embedded_aarch64            cross-built with cmake/toolchains/aarch64-linux-gnu.cmake
#                               (static): unit_test under qemu-aarch64-static, then
#                               a 2-process hello_allreduce over shm and over tcp
#                               under qemu; skipped, saying why, when
#                               aarch64-linux-gnu-g++ or qemu-aarch64-static is missing
#   embedded_armhf              the same for 32-bit ARM, only when
#                               CCLITE_EMBEDDED_ARMHF=ON (its compiler is not in
#                               install-deps.sh)
# CCLITE_NO_THREADS is tested in the main build (tests/no_threads_test.cpp).
#
# The sub-builds compile without -O (build type None: no flags of its own; an
# empty one would become Release in the top CMakeLists.txt): they test that the code
# builds and behaves with these flags or on this architecture, not its speed,
# and -O0 compiles about twice as fast as -O3. Their wall time is printed in
# the test output; see README "Footprint" for the CI cost.
#
# CCLITE_EMBEDDED_TESTS=OFF leaves all of them out (the sub-builds pass it, so
# they do not recurse).

option(CCLITE_EMBEDDED_TESTS "Register the embedded sub-build tests (-fno-exceptions, aarch64)" ON)
option(CCLITE_EMBEDDED_ARMHF "Also cross-test 32-bit ARM (needs g++-arm-linux-gnueabihf)" OFF)
set(CCLITE_EMBEDDED_TEST_REGEX "^(unit_test|shm_transport_test|tcp_transport_test|launcher_test)$"
  CACHE STRING "Tests the -fno-exceptions sub-build runs")

if(TARGET cclite-run AND TARGET edge_sensor_average)
  add_test(NAME edge_sensor_average_3ranks
    COMMAND cclite-run --timeout 120 --nproc-per-node 3 $<TARGET_FILE:edge_sensor_average>)
  set_tests_properties(edge_sensor_average_3ranks PROPERTIES LABELS "embedded" TIMEOUT 180
    PASS_REGULAR_EXPRESSION "board 2 of 3 via tcp: .*correct")
endif()

if(NOT CCLITE_EMBEDDED_TESTS OR CMAKE_CROSSCOMPILING OR NOT TARGET cclite-run)
  return()
endif()

set(_emb_common
  "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
  "-DGENERATOR=${CMAKE_GENERATOR}"
  "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
  "-DRUNNER=$<TARGET_FILE:cclite-run>"
  "-DBUILD_TYPE=None")
set(_emb_script "${CMAKE_CURRENT_LIST_DIR}/embedded_build.cmake")
set(_emb_dir "${CMAKE_CURRENT_BINARY_DIR}/embedded")

# doctest's REQUIRE family needs this without exceptions (a failing REQUIRE
# then ends the test program instead of throwing).
add_test(NAME embedded_no_exceptions
  COMMAND ${CMAKE_COMMAND} ${_emb_common}
          "-DBINARY_DIR=${_emb_dir}/noexcept"
          "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
          "-DCXX_FLAGS=-fno-exceptions -fno-rtti -fno-asynchronous-unwind-tables -DDOCTEST_CONFIG_NO_EXCEPTIONS_BUT_WITH_ALL_ASSERTS"
          "-DTARGETS=unit_test|shm_transport_test|tcp_transport_test|launcher_test|cclite-run|hello_allreduce|edge_sensor_average"
          "-DTESTS=${CCLITE_EMBEDDED_TEST_REGEX}"
          "-DRUNS=hello_allreduce:2:-|hello_allreduce:2:CCLITE_SHM_DISABLE=1|edge_sensor_average:3:-"
          -P "${_emb_script}")
set_tests_properties(embedded_no_exceptions PROPERTIES LABELS "embedded" TIMEOUT 900)

function(_cclite_cross_test name triple qemu)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} ${_emb_common}
            "-DBINARY_DIR=${_emb_dir}/${triple}"
            "-DTOOLCHAIN=${PROJECT_SOURCE_DIR}/cmake/toolchains/${triple}.cmake"
            "-DTARGETS=unit_test|hello_allreduce"
            "-DTESTS=^unit_test$"
            "-DRUNS=hello_allreduce:2:-|hello_allreduce:2:CCLITE_SHM_DISABLE=1"
            "-DREQUIRE=${triple}-g++|${qemu}"
            "-DEMULATOR_NAME=${qemu}"
            -P "${_emb_script}")
  set_tests_properties(${name} PROPERTIES LABELS "embedded" TIMEOUT 900
    SKIP_REGULAR_EXPRESSION "EMBEDDED-SKIP:")
endfunction()
_cclite_cross_test(embedded_aarch64 aarch64-linux-gnu qemu-aarch64-static)
if(CCLITE_EMBEDDED_ARMHF)
  _cclite_cross_test(embedded_armhf arm-linux-gnueabihf qemu-arm-static)
endif()

unset(_emb_common)
unset(_emb_script)
unset(_emb_dir)
