# ctest fixture setup: a fresh `cmake --install` of this build into PREFIX.
#   cmake -DBUILD_DIR=<build> -DPREFIX=<dir> [-DCONFIG=<cfg>] -P install.cmake
cmake_minimum_required(VERSION 3.24)
foreach(v BUILD_DIR PREFIX)
  if(NOT ${v})
    message(FATAL_ERROR "install.cmake: -D${v}=... is required")
  endif()
endforeach()
unset(ENV{DESTDIR})  # a DESTDIR from the environment would install elsewhere
file(REMOVE_RECURSE "${PREFIX}")
set(cmd "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}")
if(CONFIG)
  list(APPEND cmd --config "${CONFIG}")
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}\n"
    "(the install needs a finished build: run `cmake --build ${BUILD_DIR}` first)")
endif()
string(REGEX MATCHALL "\n-- (Installing|Up-to-date)" n "\n${out}")
list(LENGTH n n)
message(STATUS "installed ${n} files into ${PREFIX}")
