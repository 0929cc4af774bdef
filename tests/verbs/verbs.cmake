# The verbs transport's RDMA data path on a stand-in libibverbs
# (tests/verbs/emulated_ibverbs.cpp: one emulated HCA; RDMA writes with
# immediate copied into the peer process with process_vm_writev, checked against
# the peer's registered regions; immediates matched with posted receives), so
# that QP set-up, the striped FIFO, credits, completion channels and failure
# reports run between real processes on every machine. Not a NIC: says nothing
# about speed, real QP transitions or a fabric. The same cases run on real
# hardware through tests/verbs/run.sh.
if(TARGET cclite_verbs AND TARGET cclite_shm AND TARGET cclite_tcp)
  add_library(cclite_emulated_ibverbs SHARED ${CMAKE_CURRENT_LIST_DIR}/emulated_ibverbs.cpp)
  target_include_directories(cclite_emulated_ibverbs SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
  target_compile_options(cclite_emulated_ibverbs PRIVATE -Wall -Wextra)
  set_target_properties(cclite_emulated_ibverbs PROPERTIES CXX_VISIBILITY_PRESET default)

  # A test source of tests/ built again, linked against the stand-in instead of
  # libibverbs (so not through cclite::cclite, which links the real library).
  # Extra arguments: compile definitions.
  function(cclite_verbs_emulated_test name source)
    add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/../${source} ${CMAKE_CURRENT_LIST_DIR}/../support/main.cpp)
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..
                               ${PROJECT_SOURCE_DIR}/transports/verbs/include)
    target_include_directories(${name} SYSTEM PRIVATE ${CCLITE_IBVERBS_INCLUDE_DIR})
    target_compile_definitions(${name} PRIVATE CCLITE_HAS_VERBS=1 ${ARGN})
    target_compile_options(${name} PRIVATE -Wall -Wextra $<$<NOT:$<CONFIG:Debug>>:-O1>)
    target_link_libraries(${name} PRIVATE doctest::doctest cclite_shm cclite_tcp cclite_emulated_ibverbs
                          Threads::Threads)
  endfunction()

  # verbs_test's "verbs hardware:" cases: default settings, a 64 KiB FIFO on 3
  # QPs, a receiver that comes late (credits), the registration cache.
  cclite_verbs_emulated_test(verbs_emulated_test verbs_test.cpp)
  add_test(NAME verbs_emulated_test COMMAND verbs_emulated_test "--test-case=verbs hardware*")
  # The collective matrix over verbs (tests/verbs/run.sh's step 2): with
  # CCLITE_DEFAULT_WITH_VERBS the default communicator is <shm, verbs, tcp>, so
  # the "tcp" cases (shm disabled) and the fake nodes of the "mixed" ones go over
  # the emulated HCA.
  cclite_verbs_emulated_test(collectives_verbs_emulated collectives_test.cpp CCLITE_DEFAULT_WITH_VERBS=1)
  add_test(NAME collectives_verbs_emulated COMMAND collectives_verbs_emulated
           "--test-case=*tcp*,*mixed*,*tree forced*")
  # Groups of sends and receives (collective_test.cpp's "group" cases): every
  # peer's transfers side by side on the emulated HCA's links.
  cclite_verbs_emulated_test(group_verbs_emulated collective_test.cpp CCLITE_DEFAULT_WITH_VERBS=1)
  add_test(NAME group_verbs_emulated COMMAND group_verbs_emulated "--test-case=group: sends*")
  # Failures over verbs (fault_test.cpp, its tcp cases going over verbs): a
  # rank killed mid-collective, one leaving silently, abort, mismatches, each
  # reported on every rank, not at the deadline. RDMA reports a dead peer only
  # after the QP's retries: CCLITE_IB_TIMEOUT=12 makes them 134 ms instead of 34 s.
  cclite_verbs_emulated_test(fault_verbs_emulated fault_test.cpp CCLITE_DEFAULT_WITH_VERBS=1)
  add_test(NAME fault_verbs_emulated COMMAND fault_verbs_emulated)

  # A peer reached by tcp instead of verbs fails the two matrix tests.
  set_tests_properties(collectives_verbs_emulated fault_verbs_emulated group_verbs_emulated PROPERTIES
    FAIL_REGULAR_EXPRESSION "via tcp")
  set(emulated_ibv_dir ${CMAKE_CURRENT_BINARY_DIR}/emulated_ibverbs)
  file(MAKE_DIRECTORY ${emulated_ibv_dir})
  set_tests_properties(verbs_emulated_test collectives_verbs_emulated fault_verbs_emulated group_verbs_emulated
    PROPERTIES TIMEOUT ${CCLITE_TEST_TIMEOUT}
    ENVIRONMENT "CCLITE_EMULATED_IBV_DIR=${emulated_ibv_dir};CCLITE_DEBUG=INFO;CCLITE_IB_TIMEOUT=12")
endif()
