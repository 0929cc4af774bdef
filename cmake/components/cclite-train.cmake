# cclite-train.cmake - component "train": cclite::train, the data-parallel
# trainer (headers under cclite/train/) with its matrix-product backend.
# Included by cclite-config.cmake; sets cclite_train_FOUND (always TRUE).
#
# The consumer's CBLAS is used when one is found (OpenBLAS preferred; Debian/
# Ubuntu: libopenblas-dev): CCLITE_HAS_CBLAS=1, plus CCLITE_HAS_OPENBLAS=1 for
# OpenBLAS. Without one, cclite::train still exists and the headers use their
# portable loop nest. -DCCLITE_WITH_BLAS=OFF skips the search; BLA_VENDOR picks
# another BLAS. Not part of cclite::cclite (a BLAS is not what a communication
# user asked for). The search itself is cblas_search.cmake, shared with
# the build tree's cmake/blas.cmake.
if(TARGET cclite::train)
  set(cclite_train_FOUND TRUE)
  return()
endif()

add_library(cclite::train INTERFACE IMPORTED)
set_target_properties(cclite::train PROPERTIES INTERFACE_LINK_LIBRARIES cclite::core)
set(cclite_train_FOUND TRUE)
set(_cclite_blas "")
if(NOT DEFINED CCLITE_WITH_BLAS OR CCLITE_WITH_BLAS)
  include(${CMAKE_CURRENT_LIST_DIR}/cblas_search.cmake)
  cclite_find_cblas(cclite::train _cclite_blas)
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
