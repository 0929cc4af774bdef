# The verbs transport's RDMA data path on a stand-in libibverbs
# (tests/verbs/emulated_ibverbs.cpp: one emulated HCA; RDMA writes with
# immediate copied into the peer process with process_vm_writev, checked against
# the peer's registered regions; immediates matched with posted receives), so
# that QP set-up, the striped FIFO, credits and completion channels run between
# real processes on every machine: verbs_test's "verbs hardware:" cases. Not a
# NIC: says nothing about speed, real QP transitions or a fabric. The same cases
# run on real hardware through tests/verbs/run.sh.
if(TARGET cclite_verbs AND TARGET cclite_shm AND TARGET cclite_tcp)
  add_library(cclite_emulated_ibverbs SHARED ${CMAKE_CURRENT_LIST_DIR}/emulated_ibverbs.cpp)
  target_include_directories(cclite_emulated_ibverbs SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
  target_compile_options(cclite_emulated_ibverbs PRIVATE -Wall -Wextra)
  set_target_properties(cclite_emulated_ibverbs PROPERTIES CXX_VISIBILITY_PRESET default)
  # verbs_test.cpp again, linked against the stand-in instead of libibverbs
  # (so not through cclite::cclite, which links the real library).
  add_executable(verbs_emulated_test ${CMAKE_CURRENT_LIST_DIR}/../verbs_test.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/../support/main.cpp)
  target_include_directories(verbs_emulated_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..
                             ${PROJECT_SOURCE_DIR}/transports/verbs/include)
  target_include_directories(verbs_emulated_test SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
  target_compile_definitions(verbs_emulated_test PRIVATE CCLITE_HAS_VERBS=1)
  target_compile_options(verbs_emulated_test PRIVATE -Wall -Wextra $<$<NOT:$<CONFIG:Debug>>:-O1>)
  target_link_libraries(verbs_emulated_test PRIVATE doctest::doctest cclite_shm cclite_tcp cclite_emulated_ibverbs
                        Threads::Threads)
  set(emulated_ibv_dir ${CMAKE_CURRENT_BINARY_DIR}/emulated_ibverbs)
  file(MAKE_DIRECTORY ${emulated_ibv_dir})
  add_test(NAME verbs_emulated_test COMMAND verbs_emulated_test "--test-case=verbs hardware*")
  # The collective matrix over verbs (tests/verbs/run.sh's step 2): with
  # CCLITE_DEFAULT_WITH_VERBS the default communicator is <shm, verbs, tcp>, so
  # the "tcp" cases (shm disabled) and the fake nodes of the "mixed" ones go over
  # the emulated HCA; a peer reached by tcp instead fails the test.
  add_executable(collectives_verbs_emulated ${CMAKE_CURRENT_LIST_DIR}/../collectives_test.cpp
                                            ${CMAKE_CURRENT_LIST_DIR}/../support/main.cpp)
  target_include_directories(collectives_verbs_emulated PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..
                             ${PROJECT_SOURCE_DIR}/transports/verbs/include)
  target_include_directories(collectives_verbs_emulated SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
  target_compile_definitions(collectives_verbs_emulated PRIVATE CCLITE_HAS_VERBS=1 CCLITE_DEFAULT_WITH_VERBS=1)
  target_compile_options(collectives_verbs_emulated PRIVATE -Wall -Wextra $<$<NOT:$<CONFIG:Debug>>:-O1>)
  target_link_libraries(collectives_verbs_emulated PRIVATE doctest::doctest cclite_shm cclite_tcp
                        cclite_emulated_ibverbs Threads::Threads)
  add_test(NAME collectives_verbs_emulated COMMAND collectives_verbs_emulated
           "--test-case=*tcp*,*mixed*,*tree forced*")
  # Failures over verbs (fault_test.cpp, its tcp cases going over verbs): a
  # rank killed mid-collective, one leaving silently, abort, mismatches, each
  # reported on every rank, not at the deadline. RDMA reports a dead peer only
  # after the QP's retries: CCLITE_IB_TIMEOUT=12 makes them 134 ms instead of 34 s.
  add_executable(fault_verbs_emulated ${CMAKE_CURRENT_LIST_DIR}/../fault_test.cpp
                                      ${CMAKE_CURRENT_LIST_DIR}/../support/main.cpp)
  target_include_directories(fault_verbs_emulated PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..
                             ${PROJECT_SOURCE_DIR}/transports/verbs/include)
  target_include_directories(fault_verbs_emulated SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
  target_compile_definitions(fault_verbs_emulated PRIVATE CCLITE_HAS_VERBS=1 CCLITE_DEFAULT_WITH_VERBS=1)
  target_compile_options(fault_verbs_emulated PRIVATE -Wall -Wextra $<$<NOT:$<CONFIG:Debug>>:-O1>)
  target_link_libraries(fault_verbs_emulated PRIVATE doctest::doctest cclite_shm cclite_tcp
                        cclite_emulated_ibverbs Threads::Threads)
  add_test(NAME fault_verbs_emulated COMMAND fault_verbs_emulated)
  set_tests_properties(collectives_verbs_emulated fault_verbs_emulated PROPERTIES FAIL_REGULAR_EXPRESSION "via tcp")
  set_tests_properties(verbs_emulated_test collectives_verbs_emulated fault_verbs_emulated PROPERTIES TIMEOUT 300
    ENVIRONMENT "CCLITE_EMULATED_IBV_DIR=${emulated_ibv_dir};CCLITE_DEBUG=INFO;CCLITE_IB_TIMEOUT=12")
endif()
