# cblas_search.cmake - cclite_find_cblas(<target> <out_var>): the CBLAS
# search behind cclite::train, shared by the build tree (cmake/blas.cmake) and
# the installed package (cclite-train.cmake). Not a component of its own.
#
# Adds to <target> (an INTERFACE library, imported or not) the include dir,
# libraries and CCLITE_HAS_CBLAS=1 (+ CCLITE_HAS_OPENBLAS=1) of the first CBLAS
# found: OpenBLAS's own CMake package, else FindBLAS (OpenBLAS first unless
# BLA_VENDOR says otherwise) with a cblas.h whose cblas_sgemm links. Sets
# <out_var> to a description, or to "" when none was found (the headers then
# use their portable loop nest).
include_guard(GLOBAL)

function(cclite_find_cblas target out_var)
  set(found "")
  # 1. OpenBLAS's own CMake package (Debian ships one per variant).
  find_package(OpenBLAS CONFIG QUIET)
  if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES)
    find_path(CCLITE_CBLAS_INCLUDE_DIR cblas.h HINTS ${OpenBLAS_INCLUDE_DIRS} NO_DEFAULT_PATH)
    if(CCLITE_CBLAS_INCLUDE_DIR)
      target_include_directories(${target} SYSTEM INTERFACE ${CCLITE_CBLAS_INCLUDE_DIR})
      target_link_libraries(${target} INTERFACE ${OpenBLAS_LIBRARIES})
      target_compile_definitions(${target} INTERFACE CCLITE_HAS_CBLAS=1 CCLITE_HAS_OPENBLAS=1)
      set(found "OpenBLAS ${OpenBLAS_VERSION} (${OpenBLAS_LIBRARIES})")
    endif()
  endif()
  # 2. FindBLAS, provided it comes with cblas.h and cblas_sgemm links.
  if(NOT found)
    if(NOT BLA_VENDOR)
      set(BLA_VENDOR OpenBLAS)  # function scope: the caller's BLA_VENDOR is untouched
      find_package(BLAS QUIET)
      if(NOT BLAS_FOUND)
        unset(BLA_VENDOR)
        find_package(BLAS QUIET)
      endif()
    else()
      find_package(BLAS QUIET)
    endif()
    if(BLAS_FOUND)
      find_path(CCLITE_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
      if(CCLITE_CBLAS_INCLUDE_DIR)
        include(CheckCXXSourceCompiles)
        include(CMakePushCheckState)
        cmake_push_check_state(RESET)
        set(CMAKE_REQUIRED_INCLUDES ${CCLITE_CBLAS_INCLUDE_DIR})
        set(CMAKE_REQUIRED_LIBRARIES ${BLAS_LIBRARIES})
        set(CMAKE_REQUIRED_QUIET ON)
        check_cxx_source_compiles("#include <cblas.h>
          int main() { float a = 1, b = 1, c = 0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
            return c == 1.0f ? 0 : 1; }" CCLITE_CBLAS_LINKS)
        check_cxx_source_compiles("#include <cblas.h>
          int main() { openblas_set_num_threads(1); return 0; }" CCLITE_CBLAS_IS_OPENBLAS)
        cmake_pop_check_state()
        if(CCLITE_CBLAS_LINKS)
          target_include_directories(${target} SYSTEM INTERFACE ${CCLITE_CBLAS_INCLUDE_DIR})
          target_link_libraries(${target} INTERFACE ${BLAS_LIBRARIES})
          target_compile_definitions(${target} INTERFACE CCLITE_HAS_CBLAS=1)
          if(CCLITE_CBLAS_IS_OPENBLAS)
            target_compile_definitions(${target} INTERFACE CCLITE_HAS_OPENBLAS=1)
          endif()
          set(found "CBLAS (${BLAS_LIBRARIES})")
        endif()
      endif()
    endif()
  endif()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()
