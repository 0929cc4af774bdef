# Packaging tests (label "package"; `ctest -L package`):
#
#   header_check                      every public header compiles on its own
#                                     (tests/header_check.cmake)
#   install_prefix                    fixture: cmake --install this build into
#                                     build/tests/consumer/prefix
#   install_layout                    every header, the package files and cclite-run
#                                     are there; nothing names the source tree
#   consumer_find_package             tests/consumer/find_package against that prefix:
#                                     find_package(cclite), cclite::cclite, run it,
#                                     and the same program separately compiled
#                                     (CCLITE_SEPARATE_COMPILATION, the installed
#                                     <cclite/src.hpp>)
#   consumer_add_subdirectory         tests/consumer/add_subdirectory: cclite built
#                                     inside the consumer's tree, run it
#
# The consumers run as one rank (CCLITE_RANK=0 CCLITE_WORLD_SIZE=1) and build
# only their own program, with this build's generator, compiler and flags.

include(${CMAKE_CURRENT_LIST_DIR}/header_check.cmake)

set(_cc_src "${CMAKE_CURRENT_SOURCE_DIR}/consumer")
set(_cc_bin "${CMAKE_CURRENT_BINARY_DIR}/consumer")
set(_cc_prefix "${_cc_bin}/prefix")

# What each consumer build inherits from this one.
set(_cc_common
  "-DGENERATOR=${CMAKE_GENERATOR}"
  "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
  "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
  "-DCXX_FLAGS=${CMAKE_CXX_FLAGS}")
# No build type for a single-config generator: the consumers test packaging, not
# code generation, and -O0 halves their compile time.
get_property(_cc_multi GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
if(_cc_multi)
  list(APPEND _cc_common "-DCONFIG=$<CONFIG>")
endif()
if(CMAKE_TOOLCHAIN_FILE)
  list(APPEND _cc_common "-DTOOLCHAIN_FILE=${CMAKE_TOOLCHAIN_FILE}")
endif()
if(CMAKE_CROSSCOMPILING)
  if(CMAKE_CROSSCOMPILING_EMULATOR)
    list(JOIN CMAKE_CROSSCOMPILING_EMULATOR "|" _cc_emu)  # one word in practice
    list(APPEND _cc_common "-DEMULATOR=${_cc_emu}")
  else()
    list(APPEND _cc_common "-DRUN=OFF")
  endif()
endif()
set(_cc_env "CCLITE_RANK=0;CCLITE_WORLD_SIZE=1")

function(_cclite_consumer_test name subdir)  # ARGN: more -D arguments for build_and_run.cmake
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} ${_cc_common}
            "-DSOURCE_DIR=${_cc_src}/${subdir}" "-DBINARY_DIR=${_cc_bin}/${name}" ${ARGN}
            -P "${_cc_src}/build_and_run.cmake")
  set_tests_properties(${name} PROPERTIES LABELS "package" TIMEOUT 300 ENVIRONMENT "${_cc_env}")
endfunction()

# ---- installed package: find_package --------------------------------------------
if(CCLITE_INSTALL)
  add_test(NAME install_prefix
    COMMAND ${CMAKE_COMMAND} "-DBUILD_DIR=${PROJECT_BINARY_DIR}" "-DPREFIX=${_cc_prefix}" "-DCONFIG=$<CONFIG>"
            -P "${_cc_src}/install.cmake")
  set_tests_properties(install_prefix PROPERTIES LABELS "package" TIMEOUT 120
    FIXTURES_SETUP cclite_installed)

  set(_cc_layout_args)
  if(TARGET cclite-run)
    list(APPEND _cc_layout_args "-DTOOL=${CMAKE_INSTALL_BINDIR}/cclite-run")
  endif()
  add_test(NAME install_layout
    COMMAND ${CMAKE_COMMAND} "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DBUILD_DIR=${PROJECT_BINARY_DIR}"
            "-DPREFIX=${_cc_prefix}" "-DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}"
            "-DCMAKEDIR=${CCLITE_INSTALL_CMAKEDIR}" ${_cc_layout_args}
            -P "${_cc_src}/check_install.cmake")
  set_tests_properties(install_layout PROPERTIES LABELS "package" TIMEOUT 60
    FIXTURES_REQUIRED cclite_installed)

  # Only this prefix: no system-wide or user-registry cclite may stand in for it.
  set(_cc_find
    "-DARGS=-DCMAKE_PREFIX_PATH=${_cc_prefix}|-DCONSUMER_EXPECT_DIR=${_cc_prefix}|-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF")
  # cclite::tcp has no dependency: every install must give it.
  string(APPEND _cc_find "|-DCONSUMER_EXPECT_TCP=ON")
  _cclite_consumer_test(consumer_find_package find_package "${_cc_find}" -DSEPARATE=ON)
  set_tests_properties(consumer_find_package PROPERTIES FIXTURES_REQUIRED cclite_installed)

endif()

# ---- add_subdirectory ------------------------------------------------------------
if(TARGET cclite_shm OR TARGET cclite_tcp)  # cclite::init() needs one transport
  _cclite_consumer_test(consumer_add_subdirectory add_subdirectory
    "-DARGS=-DCCLITE_SOURCE_DIR=${PROJECT_SOURCE_DIR}|-DCCLITE_WITH_SHM=${CCLITE_WITH_SHM}|-DCCLITE_WITH_TCP=${CCLITE_WITH_TCP}")
endif()

unset(_cc_src)
unset(_cc_bin)
unset(_cc_prefix)
unset(_cc_common)
unset(_cc_multi)
unset(_cc_emu)
unset(_cc_env)
unset(_cc_layout_args)
unset(_cc_find)
unset(_cc_hide)
