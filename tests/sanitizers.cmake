# Sanitizer runs of the multi-process fault tests (issue 6), as ctest cases:
#
#   sanitize_asan_ubsan   AddressSanitizer + UndefinedBehaviorSanitizer
#   sanitize_tsan         ThreadSanitizer
#
# Each configures this source tree again in <build>/tests/san-<name> with
# -DCCLITE_SANITIZE=<list> (-O1 -g1), builds ONE test program there
# (CCLITE_SANITIZE_TARGET, default fault_test: real processes over shm and
# TCP, threads for abort() and the async queue) and runs it. Any report fails
# the test: every sanitizer halts on its first error, in the forked ranks too
# (they leave with _exit, where an exit-time report would be lost). One
# program keeps CI within its budget; README's "Failure behaviour" gives the
# times. Label "sanitize": `ctest -L sanitize`, or `-LE sanitize` to skip.
#
# The same file does three jobs:
#   - included from tests/CMakeLists.txt in a build with CCLITE_SANITIZE set:
#     instruments every test program of that build;
#   - included in an ordinary build: registers the two ctest cases;
#   - run with `cmake -P` by those cases: configure, build, run.

if(CMAKE_SCRIPT_MODE_FILE)
  # ---- cmake -P: one sanitizer run ------------------------------------------------
  foreach(v SRC BIN SAN TARGET)
    if(NOT DEFINED ${v})
      message(FATAL_ERROR "sanitizers.cmake: -D${v}=... is required")
    endif()
  endforeach()
  string(TIMESTAMP t0 "%s")
  # -g1: line tables, all a report's stack needs (file:line per frame); full
  # -g made the build a third longer (65 against 45 s for fault_test.cpp).
  set(cfg "${CMAKE_COMMAND}" -S "${SRC}" -B "${BIN}" "-DCCLITE_SANITIZE=${SAN}"
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
      -DCCLITE_BUILD_SAMPLES=OFF -DCCLITE_BUILD_BENCH=OFF -DCCLITE_BUILD_TOOLS=OFF
      # Nothing else of the project is built here: skip the optional parts'
      # detection and the other sub-build tests' registration.
      -DCCLITE_WITH_CUDA=OFF -DCCLITE_WITH_NCCL=OFF -DCCLITE_WITH_VERBS=OFF -DCCLITE_WITH_BLAS=OFF
      -DCCLITE_HEADER_CHECK=OFF -DCCLITE_EMBEDDED_TESTS=OFF -DCCLITE_SANITIZE_TESTS=OFF
      # One test program: a precompiled header would cost more than it saves.
      -DCCLITE_TEST_PCH=OFF)
  if(GENERATOR)
    list(APPEND cfg -G "${GENERATOR}")
  endif()
  if(CXX_COMPILER)
    list(APPEND cfg "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  execute_process(COMMAND ${cfg} RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring the ${SAN} build in ${BIN} failed")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BIN}" -j2 --target "${TARGET}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building ${TARGET} with -fsanitize=${SAN} failed")
  endif()
  string(TIMESTAMP t1 "%s")
  # halt_on_error everywhere: a forked rank that _exit()s would lose an
  # exit-time report; second_deadlock_stack helps read TSan's lock reports.
  set(ENV{ASAN_OPTIONS} "halt_on_error=1:abort_on_error=1:detect_leaks=1")
  set(ENV{UBSAN_OPTIONS} "halt_on_error=1:abort_on_error=1:print_stacktrace=1")
  set(ENV{TSAN_OPTIONS} "halt_on_error=1:abort_on_error=1:second_deadlock_stack=1")
  # The run's output goes to a file: the ranks' warnings about the faults the
  # test injects run to thousands of lines, and a CI log cut in the middle
  # would lose the one report that matters. On failure the report's lines come
  # first, then the end of the log; the whole log stays in ${BIN}.
  set(log "${BIN}/${TARGET}.log")
  execute_process(COMMAND "${BIN}/bin/${TARGET}" ${ARGS} RESULT_VARIABLE rc
                  OUTPUT_FILE "${log}" ERROR_FILE "${log}")
  string(TIMESTAMP t2 "%s")
  math(EXPR build_s "${t1} - ${t0}")
  math(EXPR run_s "${t2} - ${t1}")
  message(STATUS "-fsanitize=${SAN}: configure+build ${build_s} s, run ${run_s} s")
  if(NOT rc EQUAL 0)
    file(STRINGS "${log}" found LIMIT_COUNT 200 REGEX
         "Sanitizer|runtime error|SUMMARY|TEST CASE|ERROR:|failed|is NOT correct|logged:|^ +#[0-9]+ |test cases:")
    file(STRINGS "${log}" all)
    list(LENGTH all n)
    math(EXPR from "${n} - 60")
    if(from LESS 0)
      set(from 0)
    endif()
    list(SUBLIST all ${from} -1 tail)
    set(text "---- ${TARGET} under -fsanitize=${SAN}: failures and sanitizer reports (whole log: ${log})\n")
    foreach(line IN LISTS found)
      string(APPEND text "${line}\n")
    endforeach()
    string(APPEND text "---- the end of the log\n")
    foreach(line IN LISTS tail)
      string(APPEND text "${line}\n")
    endforeach()
    message("${text}")
    message(FATAL_ERROR "${TARGET} under -fsanitize=${SAN} failed (${rc})")
  endif()
  return()
endif()

if(CCLITE_SANITIZE)
  # ---- a sanitizer build: instrument the test programs ------------------------------
  string(REPLACE "," ";" _san_list "${CCLITE_SANITIZE}")
  set(_san_flags -fsanitize=${CCLITE_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _san_list)
    list(APPEND _san_flags -fno-sanitize-recover=all)
  endif()
  if("thread" IN_LIST _san_list AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC warns at every atomic_thread_fence (the shm FIFOs' publication
    # fences); TSan does not model fences, the atomics around them are seen.
    list(APPEND _san_flags -Wno-tsan)
  endif()
  add_compile_options(${_san_flags})
  add_link_options(-fsanitize=${CCLITE_SANITIZE})
  return()
endif()

# ---- an ordinary build: register the sanitizer runs ----------------------------------
set(CCLITE_SANITIZE_TARGET fault_test CACHE STRING "Test program the sanitizer ctest cases build and run")
option(CCLITE_SANITIZE_TESTS "Register the sanitizer ctest cases (sanitize_*)" ON)
if(CCLITE_SANITIZE_TESTS AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT CMAKE_CROSSCOMPILING)
  foreach(_san IN ITEMS "asan_ubsan|address,undefined" "tsan|thread")
    string(REPLACE "|" ";" _san "${_san}")
    list(GET _san 0 _name)
    list(GET _san 1 _flags)
    set(_san_args "")
    if(_name STREQUAL "tsan" AND CCLITE_SANITIZE_TARGET STREQUAL "fault_test")
      # fault_test's cases about the call check (a mismatch of count, dtype,
      # op, root or size between ranks) are half of its time under TSan (80 of
      # 150 s on an idle machine here: dozens of jobs, each forking its ranks
      # and setting up a communicator for one call, ~2.5 s a job under TSan
      # against ~0.2 s without) and add no thread to what the other cases
      # run: one blocking call on each rank, inline on its thread, and its
      # error there. ASan+UBSan runs them.
      set(_san_args "-DARGS=-tce=*mismatch*")
    endif()
    add_test(NAME sanitize_${_name}
      COMMAND ${CMAKE_COMMAND} "-DSRC=${PROJECT_SOURCE_DIR}" "-DBIN=${CMAKE_CURRENT_BINARY_DIR}/san-${_name}"
              "-DSAN=${_flags}" "-DTARGET=${CCLITE_SANITIZE_TARGET}" "-DGENERATOR=${CMAKE_GENERATOR}"
              "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}" ${_san_args}
              -P ${CMAKE_CURRENT_LIST_FILE})
    # Building takes most of the time; the runs use generous hang guards.
    set_tests_properties(sanitize_${_name} PROPERTIES TIMEOUT 900 LABELS sanitize)
  endforeach()
endif()
