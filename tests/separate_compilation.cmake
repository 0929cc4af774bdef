# Separate compilation (CCLITE_SEPARATE_COMPILATION, include/cclite/collective/
# separate_compilation.hpp), issue 8's compile time. Two tests, each running
# tests/separate_compilation_check.cmake on a program of two TUs:
#   separate_compilation      samples' hello_allreduce_separate (the default
#                             communicator; cclite_src.cpp is src.hpp alone),
#                             2 ranks over shm, 3 over tcp
#   separate_compilation_tcp  tests/separate_compilation/tcp_main.cpp: a
#                             communicator<tcp::transport> declared extern with
#                             CCLITE_EXTERN_COMMUNICATOR, compiled in tcp_src.cpp
#                             by CCLITE_INSTANTIATE_COMMUNICATOR; 3 ranks
# The check: the program's object defines none of the communicator's layers'
# own members nor the set-up code of init() (detail::env_store) while the src
# TU's object defines them (the extern template declarations and CCLITE_DECL
# really keep that code out of the program's TUs: a broken macro would compile
# it everywhere again and still run), and the program runs correctly.
if(NOT TARGET cclite-run)
  return()
endif()

function(_cclite_separate_test name main_objects src_objects program runs)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} "-DNM=${CMAKE_NM}" "-DRUNNER=$<TARGET_FILE:cclite-run>"
            "-DPROGRAM=$<TARGET_FILE:${program}>"
            "-DMAIN_OBJECTS=$<TARGET_OBJECTS:${main_objects}>"
            "-DSRC_OBJECTS=$<TARGET_OBJECTS:${src_objects}>"
            "-DRUNS=${runs}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/separate_compilation_check.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "embedded" TIMEOUT 300)
endfunction()

if(TARGET hello_allreduce_separate)
  _cclite_separate_test(separate_compilation hello_allreduce_separate_main hello_allreduce_separate_src
                        hello_allreduce_separate "2:shm:CCLITE_SHM_DISABLE=0|3:tcp:CCLITE_SHM_DISABLE=1")
endif()

if(TARGET cclite::shm AND TARGET cclite::tcp)
  cclite_add_separate_program(separate_tcp ${CMAKE_CURRENT_SOURCE_DIR}/separate_compilation/tcp_main.cpp
                              ${CMAKE_CURRENT_SOURCE_DIR}/separate_compilation/tcp_src.cpp)
  _cclite_separate_test(separate_compilation_tcp separate_tcp_main separate_tcp_src separate_tcp
                        "3:tcp:CCLITE_SHM_DISABLE=0")
endif()
