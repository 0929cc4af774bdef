# libFuzzer targets for the wire parsers (label "fuzz"; `ctest -L fuzz`):
#
#   fuzz_store_frame   tests/fuzz/store_frame_fuzz.cpp: the TCP store's handshake,
#                      request and reply parsers (store_protocol.hpp, store_auth.hpp)
#   fuzz_hello         tests/fuzz/hello_fuzz.cpp: the TCP data transport's hello frame
#   fuzz_checkpoint    tests/fuzz/checkpoint_fuzz.cpp: loading a training checkpoint
#                      and restoring a model, optimiser and sampler from it
#   fuzz_trace_file    tests/fuzz/trace_file_fuzz.cpp: cclite-trace reading flight
#                      recorder files and comparing the ranks (tools/trace/)
#
# Each test builds its target with clang++ -fsanitize=fuzzer,address,undefined
# (at test time, so the normal build needs no clang) and runs it for
# CCLITE_FUZZ_SECONDS (default 8) over a copy of the committed seed corpus
# tests/fuzz/corpus/<target>/ (libFuzzer adds what it finds to the copy, never
# to the source tree). Without a clang++ that links -fsanitize=fuzzer (Debian:
# apt-get install clang) the test reports SKIPPED with the reason.
find_program(CCLITE_FUZZ_CXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14
  DOC "clang++ used to build the libFuzzer targets")
set(CCLITE_FUZZ_SECONDS 8 CACHE STRING "seconds each libFuzzer target runs in ctest")

foreach(_fz store_frame hello checkpoint trace_file)
  add_test(NAME fuzz_${_fz}
    COMMAND ${CMAKE_COMMAND}
            "-DCXX=${CCLITE_FUZZ_CXX}"
            "-DSOURCE=${CMAKE_CURRENT_LIST_DIR}/${_fz}_fuzz.cpp"
            "-DCORPUS=${CMAKE_CURRENT_LIST_DIR}/corpus/${_fz}"
            "-DWORK=${CMAKE_CURRENT_BINARY_DIR}/fuzz/${_fz}"
            "-DINCLUDES=${PROJECT_SOURCE_DIR}/include|${PROJECT_SOURCE_DIR}/transports/tcp/include|${PROJECT_SOURCE_DIR}/tools"
            "-DSECONDS=${CCLITE_FUZZ_SECONDS}"
            -P ${CMAKE_CURRENT_LIST_DIR}/run_fuzz.cmake)
  set_tests_properties(fuzz_${_fz} PROPERTIES LABELS "fuzz" TIMEOUT 600
    SKIP_REGULAR_EXPRESSION "FUZZ SKIPPED")
endforeach()
unset(_fz)
