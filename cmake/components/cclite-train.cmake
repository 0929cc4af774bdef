# cclite-train.cmake - component "train": cclite::train, the data-parallel
# trainer (headers under cclite/train/) with its matrix-product backend.
# Included by cclite-config.cmake; sets cclite_train_FOUND (always TRUE).
#
# The consumer's CBLAS is used when one is found (OpenBLAS preferred; Debian/
# Ubuntu: libopenblas-dev): CCLITE_HAS_CBLAS=1, plus CCLITE_HAS_OPENBLAS=1 for
# OpenBLAS. Without one, cclite::train still exists and the headers use their
# portable loop nest. -DCCLITE_WITH_BLAS=OFF skips the search; BLA_VENDOR picks
# another BLAS. Not part of cclite::cclite (a BLAS is not what a communication
# user asked for). Keep in step with cmake/blas.cmake.
if(TARGET cclite::train)
  set(cclite_train_FOUND TRUE)
  return()
endif()

add_library(cclite::train INTERFACE IMPORTED)
set_target_properties(cclite::train PROPERTIES INTERFACE_LINK_LIBRARIES cclite::core)
set(cclite_train_FOUND TRUE)
set(_cclite_blas "")

if(NOT DEFINED CCLITE_WITH_BLAS OR CCLITE_WITH_BLAS)
  # 1. OpenBLAS's own CMake package.
  find_package(OpenBLAS CONFIG QUIET)
  if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES)
    find_path(CCLITE_CBLAS_INCLUDE_DIR cblas.h HINTS ${OpenBLAS_INCLUDE_DIRS} NO_DEFAULT_PATH)
    if(CCLITE_CBLAS_INCLUDE_DIR)
      set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${CCLITE_CBLAS_INCLUDE_DIR})
      set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${OpenBLAS_LIBRARIES})
      set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS
                   CCLITE_HAS_CBLAS=1 CCLITE_HAS_OPENBLAS=1)
      set(_cclite_blas "OpenBLAS ${OpenBLAS_VERSION}")
    endif()
  endif()
  # 2. FindBLAS (OpenBLAS first unless BLA_VENDOR says otherwise), with cblas.h
  #    and a cblas_sgemm that links.
  if(NOT _cclite_blas)
    set(_cclite_vendor_given "${BLA_VENDOR}")
    if(NOT BLA_VENDOR)
      set(BLA_VENDOR OpenBLAS)
    endif()
    find_package(BLAS QUIET)
    if(NOT BLAS_FOUND AND NOT _cclite_vendor_given)
      unset(BLA_VENDOR)
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
          set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${CCLITE_CBLAS_INCLUDE_DIR})
          set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${BLAS_LIBRARIES})
          set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS CCLITE_HAS_CBLAS=1)
          if(CCLITE_CBLAS_IS_OPENBLAS)
            set_property(TARGET cclite::train APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS CCLITE_HAS_OPENBLAS=1)
          endif()
          set(_cclite_blas "CBLAS (${BLAS_LIBRARIES})")
        endif()
      endif()
    endif()
    if(NOT _cclite_vendor_given)
      unset(BLA_VENDOR)
    endif()
    unset(_cclite_vendor_given)
  endif()
endif()

if(NOT cclite_FIND_QUIETLY)
  if(_cclite_blas)
    message(STATUS "cclite::train: matrix products via ${_cclite_blas}")
  else()
    message(STATUS "cclite::train: no CBLAS found: matrix products use the slow portable fallback "
                   "(Debian/Ubuntu: apt-get install libopenblas-dev)")
  endif()
endif()
unset(_cclite_blas)
