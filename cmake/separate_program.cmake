# cmake/separate_program.cmake - a program of this tree built with
# CCLITE_SEPARATE_COMPILATION (include/cclite/collective/separate_compilation.hpp):
#
#   cclite_add_separate_program(NAME MAIN_SOURCE SRC_SOURCE)
#
# MAIN_SOURCE is the program, SRC_SOURCE its one TU of <cclite/src.hpp>. Each is
# an object library of its own (NAME_main, NAME_src), so that a test can look
# into each object (tests/separate_compilation.cmake); the executable NAME
# links both against cclite::cclite, with --gc-sections where the linker has it
# (src.hpp compiles every member of the communicator; the unused ones go).
function(cclite_add_separate_program name main_source src_source)
  add_library(${name}_main OBJECT ${main_source})
  add_library(${name}_src OBJECT ${src_source})
  foreach(t ${name}_main ${name}_src)
    target_link_libraries(${t} PRIVATE cclite::cclite)
    target_compile_definitions(${t} PRIVATE CCLITE_SEPARATE_COMPILATION)
  endforeach()
  add_executable(${name} $<TARGET_OBJECTS:${name}_main> $<TARGET_OBJECTS:${name}_src>)
  target_link_libraries(${name} PRIVATE cclite::cclite)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT APPLE)
    target_link_options(${name} PRIVATE LINKER:--gc-sections)
  endif()
endfunction()
