# Builds one libFuzzer target and runs it for a bounded time (see fuzz.cmake).
#   cmake -DCXX=clang++ -DSOURCE=x_fuzz.cpp -DCORPUS=corpus/x -DWORK=dir
#         -DINCLUDES=a|b -DSECONDS=15 -P run_fuzz.cmake
# Prints "FUZZ SKIPPED: <why>" (ctest: skipped) when no usable clang is found.
cmake_minimum_required(VERSION 3.16)

if(NOT CXX OR NOT EXISTS "${CXX}")
  message("FUZZ SKIPPED: no clang++ found at configure time (install Debian's clang, e.g. "
          "scripts/install-deps.sh, then re-run cmake)")
  return()
endif()

get_filename_component(name "${SOURCE}" NAME_WE)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus")
set(bin "${WORK}/${name}")

string(REPLACE "|" ";" incs "${INCLUDES}")
set(iflags)
foreach(i ${incs})
  list(APPEND iflags "-I${i}")
endforeach()

# libFuzzer's runtime is a separate package on Debian (libclang-rt-NN-dev): try a
# one-line program first so that its absence is a skip with the reason, not a failure.
file(WRITE "${WORK}/probe.cpp"
  "#include <cstdint>\n#include <cstddef>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
execute_process(COMMAND "${CXX}" -fsanitize=fuzzer "${WORK}/probe.cpp" -o "${WORK}/probe"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  string(SUBSTRING "${out}" 0 400 out)
  message("FUZZ SKIPPED: ${CXX} cannot link -fsanitize=fuzzer (install clang and its runtime, "
          "libclang-rt-*-dev): ${out}")
  return()
endif()

execute_process(COMMAND "${CXX}" -std=c++17 -g -O1 -fno-omit-frame-pointer
                        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
                        ${iflags} "${SOURCE}" -o "${bin}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${name} with ${CXX} failed")
endif()

# New inputs go to the first directory (the copy); the seeds are only read.
file(GLOB seeds "${CORPUS}/*")
file(COPY ${seeds} DESTINATION "${WORK}/corpus")
execute_process(COMMAND "${bin}" -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
                        -print_final_stats=1 "-artifact_prefix=${WORK}/" "${WORK}/corpus"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${out}")
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" units "${out}")
string(REGEX MATCH "cov: [0-9]+ ft: [0-9]+" cov "${out}")
if(NOT rc EQUAL 0)
  string(LENGTH "${out}" len)
  if(len GREATER 6000)
    math(EXPR from "${len} - 6000")
    string(SUBSTRING "${out}" ${from} -1 out)
  endif()
  message("${out}")
  message(FATAL_ERROR "${name} found a crash (exit ${rc}); the input is in ${WORK}/crash-*; "
                      "reproduce with: ${bin} ${WORK}/crash-<hash>")
endif()
message("${name}: ${done}s, ${cov} (${units}); seeds ${CORPUS}")
