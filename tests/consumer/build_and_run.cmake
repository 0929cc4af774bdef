# Configures, builds and runs one consumer project (find_package/ or add_subdirectory/)
# in a fresh build tree, with the compiler and generator of the cclite build.
#
#   cmake -DSOURCE_DIR=<consumer> -DBINARY_DIR=<dir> -DGENERATOR=<gen> [-DMAKE_PROGRAM=..]
#         [-DCXX_COMPILER=..] [-DCXX_FLAGS=..] [-DTOOLCHAIN_FILE=..] [-DCONFIG=<cfg>]
#         [-DARGS=-Da=1|-Db=2]   extra configure arguments, '|'-separated
#         [-DEXPECT_CONFIGURE_ERROR=<regex>]  configure must fail, saying this
#         [-DEMULATOR=cmd|arg] [-DRUN=OFF]
#         [-DSEPARATE=ON]        also build and run cclite_consumer_separate
#         -P build_and_run.cmake
cmake_minimum_required(VERSION 3.24)
foreach(v SOURCE_DIR BINARY_DIR GENERATOR)
  if(NOT ${v})
    message(FATAL_ERROR "build_and_run.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  if(NOT rc EQUAL 0 AND NOT what STREQUAL "configure-may-fail")
    list(JOIN ARGN " " line)
    message(FATAL_ERROR "${what} failed (${rc}):\n  ${line}\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE "${BINARY_DIR}")

set(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}")
if(MAKE_PROGRAM)
  list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(TOOLCHAIN_FILE)
  list(APPEND configure "-DCMAKE_TOOLCHAIN_FILE=${TOOLCHAIN_FILE}")
elseif(CXX_COMPILER)
  list(APPEND configure "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(CXX_FLAGS)
  list(APPEND configure "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
endif()
if(CONFIG)
  list(APPEND configure "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(ARGS)
  string(REPLACE "|" ";" ARGS "${ARGS}")
  list(APPEND configure ${ARGS})
endif()

if(DEFINED EXPECT_CONFIGURE_ERROR)
  run_step(configure-may-fail ${configure})
  if(rc EQUAL 0)
    message(FATAL_ERROR "configure succeeded; expected it to fail with \"${EXPECT_CONFIGURE_ERROR}\":\n${out}")
  endif()
  if(NOT out MATCHES "${EXPECT_CONFIGURE_ERROR}")
    message(FATAL_ERROR "configure failed, but without \"${EXPECT_CONFIGURE_ERROR}\":\n${out}")
  endif()
  message(STATUS "configure failed as expected:\n${out}")
  return()
endif()

run_step(configure ${configure})
string(REGEX MATCHALL "\n-- cclite[^\n]*" found "\n${out}")  # what the consumer found
foreach(line IN LISTS found)
  string(REGEX REPLACE "^\n-- " "" line "${line}")
  message(STATUS "${line}")
endforeach()

set(programs cclite_consumer)
if(SEPARATE)  # the consumer also builds cclite_consumer_separate
  list(APPEND programs cclite_consumer_separate)
endif()
set(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --target ${programs})
if(CONFIG)
  list(APPEND build --config "${CONFIG}")
endif()
run_step(build ${build})

if(DEFINED RUN AND NOT RUN)
  message(STATUS "built; not run (cross-compiled without an emulator)")
  return()
endif()
# A job of one: the explicit launcher variables, and nothing that would send
# cclite looking for a rendezvous or another launcher's rank.
foreach(v RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID
          CCLITE_RDZV_ENDPOINT CCLITE_RDZV_DIR CCLITE_LOCAL_RANK CCLITE_LOCAL_WORLD_SIZE CCLITE_NODE_RANK
          OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS)
  unset(ENV{${v}})
endforeach()
set(ENV{CCLITE_RANK} 0)
set(ENV{CCLITE_WORLD_SIZE} 1)
if(NOT DEFINED ENV{CCLITE_TIMEOUT})
  set(ENV{CCLITE_TIMEOUT} 60)
endif()
string(REPLACE "|" ";" EMULATOR "${EMULATOR}")
foreach(program IN LISTS programs)
  run_step(run ${EMULATOR} "${BINARY_DIR}/bin/${program}")
  message(STATUS "${out}")
endforeach()
