# tests/netns: multi-node jobs on simulated nodes (network namespaces, one
# cclite-run agent per node). Needs root and `ip netns`; each case exits 77
# (ctest: skipped) with the reason printed when they are missing. Label
# "netns": `ctest -L netns`. See tests/netns/README.md.
add_executable(collectives_check ${CMAKE_CURRENT_LIST_DIR}/collectives_check.cpp)
target_link_libraries(collectives_check PRIVATE cclite::cclite)

if(TARGET cclite-run)
  foreach(case 2x2 3x1 hostnames ifname ifname_auto ifname_wrong agent_killed host_lost host_lost_connect elastic elastic_grow rdzv_id srun srun_agents trace_request)
    add_test(NAME netns_${case} COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netns_test.sh ${case})
    set_tests_properties(netns_${case} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 240 LABELS netns
      ENVIRONMENT "CCLITE_BIN_DIR=${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
  endforeach()
endif()

# Debian's real Open MPI mpirun starting cclite programs (skipped without mpirun).
if(TARGET hello_allreduce)
  add_test(NAME mpirun_launch COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/mpirun_test.sh)
  set_tests_properties(mpirun_launch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS launch
    ENVIRONMENT "CCLITE_BIN_DIR=${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
endif()

# Debian's real torchrun (python3-torch) starting cclite programs: its agent's
# store, --standalone, a restart, two simulated nodes (skipped without torchrun).
if(TARGET hello_allreduce)
  add_test(NAME torchrun_launch COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/torchrun_test.sh)
  set_tests_properties(torchrun_launch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 400 LABELS launch
    RESOURCE_LOCK torchrun ENVIRONMENT "CCLITE_BIN_DIR=${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
  # The same cases under torch 2.x's torchrun, in the Debian 13 root that
  # scripts/torch2-root.sh makes (skipped without it; root only).
  add_test(NAME torchrun_launch_torch2 COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/torchrun_torch2.sh)
  set_tests_properties(torchrun_launch_torch2 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 400 LABELS launch
    RESOURCE_LOCK torchrun ENVIRONMENT "CCLITE_BIN_DIR=${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
endif()
