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

include(${PROJECT_SOURCE_DIR}/cmake/components/cblas_search.cmake)
set(CCLITE_TRAIN_BLAS "")
if(CCLITE_WITH_BLAS)
  cclite_find_cblas(cclite_train CCLITE_TRAIN_BLAS)
endif()
if(NOT CCLITE_TRAIN_BLAS)
  set(CCLITE_TRAIN_BLAS "portable")
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
