# cmake/blas.cmake - the matrix-product backend of cclite::train.
#
# Defines the INTERFACE target cclite::train (cclite_train): cclite::core plus
# a CBLAS when one is found, announced to the headers as CCLITE_HAS_CBLAS=1
# (and CCLITE_HAS_OPENBLAS=1 for OpenBLAS, which lets
# train::set_compute_threads() set its thread count). OpenBLAS is preferred:
# Debian's build picks its kernels at run time for the CPU it runs on
# (DYNAMIC_ARCH), so a binary built for generic x86-64 still gets AVX2/AVX-512
# matrix products. Without any CBLAS the target still exists and the headers
# fall back to a portable (much slower) loop nest; configure says so.
#
#   CCLITE_WITH_BLAS=OFF   skip the search (portable fallback)
#   BLA_VENDOR=...         another BLAS for FindBLAS (e.g. FLAME, Intel10_64lp)
#
# Debian/Ubuntu: apt-get install libopenblas-dev (scripts/install-deps.sh does).
option(CCLITE_WITH_BLAS "cclite::train: use a CBLAS (OpenBLAS preferred) for matrix products" ON)

add_library(cclite_train INTERFACE)
add_library(cclite::train ALIAS cclite_train)
target_link_libraries(cclite_train INTERFACE cclite_core)

set(CCLITE_TRAIN_BLAS "portable")
if(CCLITE_WITH_BLAS)
  # 1. OpenBLAS's own CMake package (Debian ships one per variant).
  find_package(OpenBLAS CONFIG QUIET)
  if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES)
    find_path(CCLITE_CBLAS_INCLUDE_DIR cblas.h HINTS ${OpenBLAS_INCLUDE_DIRS} NO_DEFAULT_PATH)
    if(CCLITE_CBLAS_INCLUDE_DIR)
      target_include_directories(cclite_train SYSTEM INTERFACE ${CCLITE_CBLAS_INCLUDE_DIR})
      target_link_libraries(cclite_train INTERFACE ${OpenBLAS_LIBRARIES})
      target_compile_definitions(cclite_train INTERFACE CCLITE_HAS_CBLAS=1 CCLITE_HAS_OPENBLAS=1)
      set(CCLITE_TRAIN_BLAS "OpenBLAS ${OpenBLAS_VERSION} (${OpenBLAS_LIBRARIES})")
    endif()
  endif()
  # 2. FindBLAS: OpenBLAS first, then whatever BLA_VENDOR / the system offers,
  #    provided it comes with cblas.h and cblas_sgemm links.
  if(CCLITE_TRAIN_BLAS STREQUAL "portable")
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
          target_include_directories(cclite_train SYSTEM INTERFACE ${CCLITE_CBLAS_INCLUDE_DIR})
          target_link_libraries(cclite_train INTERFACE ${BLAS_LIBRARIES})
          target_compile_definitions(cclite_train INTERFACE CCLITE_HAS_CBLAS=1)
          if(CCLITE_CBLAS_IS_OPENBLAS)
            target_compile_definitions(cclite_train INTERFACE CCLITE_HAS_OPENBLAS=1)
          endif()
          set(CCLITE_TRAIN_BLAS "CBLAS (${BLAS_LIBRARIES})")
        endif()
      endif()
    endif()
    if(NOT _cclite_vendor_given)
      unset(BLA_VENDOR)
    endif()
    unset(_cclite_vendor_given)
  endif()
endif()

if(CCLITE_TRAIN_BLAS STREQUAL "portable")
  message(STATUS "cclite::train: no CBLAS found: matrix products use the slow portable fallback "
                 "(Debian/Ubuntu: apt-get install libopenblas-dev, then re-run cmake)")
else()
  message(STATUS "cclite::train: matrix products via ${CCLITE_TRAIN_BLAS}")
endif()

# The tests of the train layer (tests/trainer_test.cpp, tests/train_*_test.cpp)
# are created by tests/CMakeLists.txt, which links only cclite_test_main; once
# the whole tree is configured, link them to cclite::train too (so they test
# the backend the samples use), and make the sample's end-to-end test build
# the programs it runs.
function(_cclite_train_link_tests)
  foreach(_t IN ITEMS trainer_test train_units_test)
    if(TARGET ${_t})
      target_link_libraries(${_t} PRIVATE cclite_train)
    endif()
  endforeach()
  if(TARGET train_sample_test)
    foreach(_p IN ITEMS cclite-run train_fashion_mnist)
      if(TARGET ${_p})
        add_dependencies(train_sample_test ${_p})
      endif()
    endforeach()
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL _cclite_train_link_tests)
