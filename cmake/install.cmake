# Install rules and the relocatable package (architecture-notes §2.8).
#
#   cmake --install build --prefix P
#
# gives
#   P/include/cclite/...                  every header: core and every transport under
#                                         transports/*/include, built here or not
#   P/share/cmake/cclite/
#     cclite-config.cmake                 find_package(cclite [COMPONENTS shm tcp ...])
#     cclite-config-version.cmake         SameMinorVersion, ARCH_INDEPENDENT
#     ccliteTargets.cmake                 cclite::core, cclite::shm (no third-party deps)
#     cclite-<name>.cmake                 one per component (shm, tcp, train), from
#                                         cmake/components/: makes cclite::<name> on the
#                                         consumer's machine once its dependency is found there
#   P/bin/cclite-run                      when CCLITE_BUILD_TOOLS (tools/CMakeLists.txt)
#
# Transports with a third-party dependency (verbs: libibverbs; cuda, nccl) are
# not exported: the export would pin this machine's paths and require the
# dependency at import time. Their component file finds it on the consumer's
# side instead, so the CCLITE_WITH_* options decide only what this tree builds
# and tests. tcp (no dependency since the store left Asio) keeps its component
# file too, which makes cclite::tcp wherever it is installed.

option(CCLITE_INSTALL "Generate the install rules and the cclite package" ${PROJECT_IS_TOP_LEVEL})
if(NOT CCLITE_INSTALL)
  return()
endif()

set(CCLITE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/cclite" CACHE STRING
    "Where cclite-config.cmake goes, relative to the install prefix")
mark_as_advanced(CCLITE_INSTALL_CMAKEDIR)

# Dependency-free targets: a normal export set. FILE_SET HEADERS installs the
# headers and adds ${CMAKE_INSTALL_INCLUDEDIR} to the exported include path.
set(_cclite_exported cclite_core)
if(TARGET cclite_shm)
  list(APPEND _cclite_exported cclite_shm)
endif()
install(TARGETS ${_cclite_exported} EXPORT ccliteTargets
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})  # for consumers' CMake < 3.23 (no FILE_SET)
install(EXPORT ccliteTargets NAMESPACE cclite:: DESTINATION ${CCLITE_INSTALL_CMAKEDIR})

# Every other transport's headers, unconditionally: they are only headers, and
# whether cclite::<name> exists is decided when the consumer configures.
file(GLOB _cclite_transport_dirs LIST_DIRECTORIES true "${PROJECT_SOURCE_DIR}/transports/*")
foreach(_dir IN LISTS _cclite_transport_dirs)
  get_filename_component(_name "${_dir}" NAME)
  if(IS_DIRECTORY "${_dir}/include" AND NOT "cclite_${_name}" IN_LIST _cclite_exported)
    install(DIRECTORY "${_dir}/include/" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endforeach()

# One hand-written file per component (cmake/components/cclite-<name>.cmake);
# the config learns the list of names from what is installed here.
file(GLOB _cclite_component_files "${PROJECT_SOURCE_DIR}/cmake/components/cclite-*.cmake")
# Those with a transports/<name>/ folder join the installed cclite::cclite, as
# they join the build tree's; the others (train) are linked by name.
set(CCLITE_PACKAGE_COMPONENTS "")
set(CCLITE_PACKAGE_TRANSPORTS "")
foreach(_file IN LISTS _cclite_component_files)
  get_filename_component(_name "${_file}" NAME_WE)
  string(REGEX REPLACE "^cclite-" "" _name "${_name}")
  list(APPEND CCLITE_PACKAGE_COMPONENTS ${_name})
  if(IS_DIRECTORY "${PROJECT_SOURCE_DIR}/transports/${_name}")
    list(APPEND CCLITE_PACKAGE_TRANSPORTS ${_name})
  endif()
endforeach()
list(SORT CCLITE_PACKAGE_COMPONENTS)
list(SORT CCLITE_PACKAGE_TRANSPORTS)
install(FILES ${_cclite_component_files} ${PROJECT_SOURCE_DIR}/cmake/components/cblas_search.cmake
        DESTINATION ${CCLITE_INSTALL_CMAKEDIR})  # + the CBLAS search cclite-train.cmake uses

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/cclite-config.cmake.in"
  "${PROJECT_BINARY_DIR}/cmake/cclite-config.cmake"
  INSTALL_DESTINATION ${CCLITE_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/cmake/cclite-config-version.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion
  ARCH_INDEPENDENT)  # header-only: a 32-bit consumer may use a 64-bit machine's install
install(FILES "${PROJECT_BINARY_DIR}/cmake/cclite-config.cmake"
              "${PROJECT_BINARY_DIR}/cmake/cclite-config-version.cmake"
        DESTINATION ${CCLITE_INSTALL_CMAKEDIR})

unset(_cclite_exported)
unset(_cclite_transport_dirs)
unset(_cclite_component_files)
unset(_dir)
unset(_file)
unset(_name)
