# cclite-verbs.cmake - component "verbs": cclite::verbs, the InfiniBand / RoCE
# transport. Included by cclite-config.cmake; sets cclite_verbs_FOUND and, when
# FALSE, cclite_verbs_NOT_FOUND_MESSAGE.
#
# Needs libibverbs from rdma-core on the consumer's machine (Debian/Ubuntu
# libibverbs-dev, Fedora rdma-core-devel). Keep the definitions in step with
# transports/verbs/CMakeLists.txt.
if(TARGET cclite::verbs)
  set(cclite_verbs_FOUND TRUE)
  return()
endif()

find_path(CCLITE_IBVERBS_INCLUDE_DIR infiniband/verbs.h
  DOC "Directory holding infiniband/verbs.h (Debian/Ubuntu: libibverbs-dev)")
find_library(CCLITE_IBVERBS_LIBRARY ibverbs DOC "libibverbs from rdma-core")
if(NOT CCLITE_IBVERBS_INCLUDE_DIR OR NOT CCLITE_IBVERBS_LIBRARY)
  set(cclite_verbs_FOUND FALSE)
  string(CONCAT cclite_verbs_NOT_FOUND_MESSAGE
      "cclite::verbs needs libibverbs (rdma-core), and infiniband/verbs.h or libibverbs was not "
      "found. Install it ('apt-get install libibverbs-dev' on Debian/Ubuntu, 'dnf install "
      "rdma-core-devel' on Fedora), or pass -DCCLITE_IBVERBS_INCLUDE_DIR=... -DCCLITE_IBVERBS_LIBRARY=...")
  return()
endif()

add_library(cclite::verbs INTERFACE IMPORTED)
set_target_properties(cclite::verbs PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${CCLITE_IBVERBS_INCLUDE_DIR}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CCLITE_IBVERBS_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "CCLITE_HAS_VERBS=1"
  INTERFACE_LINK_LIBRARIES "cclite::core;Threads::Threads;${CCLITE_IBVERBS_LIBRARY}")
set(cclite_verbs_FOUND TRUE)
