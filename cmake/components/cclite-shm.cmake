# cclite-shm.cmake - component "shm": cclite::shm, POSIX shared memory inside a node.
# Included by cclite-config.cmake; sets cclite_shm_FOUND.
#
# cclite::shm has no third-party dependency, so ccliteTargets.cmake normally
# exports it. This file makes it only when the package was built with
# CCLITE_WITH_SHM=OFF (the headers are installed either way). Keep in step
# with transports/shm/CMakeLists.txt.
if(TARGET cclite::shm)
  set(cclite_shm_FOUND TRUE)
  return()
endif()

find_library(CCLITE_RT_LIBRARY rt)  # shm_open on glibc < 2.34; optional elsewhere
mark_as_advanced(CCLITE_RT_LIBRARY)
add_library(cclite::shm INTERFACE IMPORTED)
set_target_properties(cclite::shm PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS "CCLITE_HAS_SHM=1"
  INTERFACE_LINK_LIBRARIES "cclite::core;$<$<BOOL:${CCLITE_RT_LIBRARY}>:${CCLITE_RT_LIBRARY}>")
set(cclite_shm_FOUND TRUE)
