# cmake -DNM=... -DRUNNER=cclite-run -DPROGRAM=... -DMAIN_OBJECTS=... -DSRC_OBJECTS=...
#       -DRUNS=NP:VIA:ENV|...  -P separate_compilation_check.cmake
# (registered by separate_compilation.cmake). Each run: NP ranks under cclite-run
# with the environment setting ENV; every rank must print hello_allreduce's
# line "... via VIA): sum of ranks = N (correct)".
cmake_minimum_required(VERSION 3.24)

# Defined functions of the communicator's layers (their own members, whole
# lines: not the member templates of each collective, not the lambdas inside a
# member, whose names go on with "::{lambda") and of init()'s set-up code.
set(_layer_re "[TW] cclite::detail::(comm_core|comm_checks|comm_algorithms|comm_shared)<[^(\n]*>::[a-z_]+\\([^{\n]*\n")
set(_setup_re "[TW] cclite::detail::env_store::open\\(")

function(defined_symbols objects out)
  execute_process(COMMAND "${NM}" -C --defined-only ${objects}
    RESULT_VARIABLE rc OUTPUT_VARIABLE syms ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${objects}: ${err}")
  endif()
  set(${out} "${syms}" PARENT_SCOPE)
endfunction()

defined_symbols("${MAIN_OBJECTS}" _main)
defined_symbols("${SRC_OBJECTS}" _src)
foreach(what IN ITEMS layer setup)
  set(re "${_${what}_re}")
  string(REGEX MATCH "${re}" hit "${_main}")
  if(hit)
    message(FATAL_ERROR "the program's TU compiled what its src TU should compile alone:\n  ${hit}")
  endif()
  string(REGEX MATCHALL "${re}" hits "${_src}")
  list(LENGTH hits n)
  if(n EQUAL 0)
    message(FATAL_ERROR "the src TU's object defines no ${what} function (regex: ${re})")
  endif()
  message("${what} code: the src TU's object defines ${n} functions, the program's none")
endforeach()

# The program works.
string(REPLACE "|" ";" _runs "${RUNS}")
foreach(run IN LISTS _runs)
  string(REPLACE ":" ";" run "${run}")
  list(GET run 0 np)
  list(GET run 1 via)
  list(GET run 2 env)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} "${RUNNER}" --timeout 120 --nproc-per-node ${np} "${PROGRAM}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${np} ranks over ${via}:\n${out}")
  string(REGEX MATCHALL "via ${via}\\): sum of ranks = [0-9]+ \\(correct\\)" ok "${out}")
  list(LENGTH ok n)
  if(NOT rc EQUAL 0 OR NOT n EQUAL np)
    message(FATAL_ERROR "${PROGRAM}, ${np} ranks over ${via}: exit ${rc}, ${n} of ${np} ranks correct")
  endif()
endforeach()
