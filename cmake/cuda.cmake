# CUDA Toolkit and nvcc detection, included by the top-level CMakeLists.txt
# before transports/ (enable_language must run in the directory that holds every
# target compiling CUDA: here the top level, so tests/ and bench/ can add .cu files).
#
#   CCLITE_WITH_CUDA (ON)      cclite::cuda (transports/cuda) when the toolkit is found
#   CCLITE_WITH_NCCL (ON)      cclite::nccl (transports/nccl) when NCCL is found too
#   CMAKE_CUDA_ARCHITECTURES   default 90 (H100/H200); e.g. -DCMAKE_CUDA_ARCHITECTURES=80
#
# Neither is an error when missing: the CPU transports build as before. The
# result: CUDAToolkit_FOUND, and CMAKE_CUDA_COMPILER set (CUDA enabled) when
# nvcc was found as well; targets compiling .cu files check CCLITE_CUDA_LANGUAGE.
option(CCLITE_WITH_CUDA "CUDA runtime layer and device reduction kernels (CUDA Toolkit; skipped when not found)" ON)
option(CCLITE_WITH_NCCL "NCCL collective backend (needs the CUDA Toolkit; skipped when not found)" ON)

set(CCLITE_CUDA_LANGUAGE OFF)
if(CCLITE_WITH_CUDA)
  # FindCUDAToolkit looks at nvcc on PATH, CUDAToolkit_ROOT, $CUDA_PATH and /usr/local/cuda.
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE
       AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
      # The toolkit's own nvcc, even when /usr/local/cuda/bin is not on PATH.
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}" CACHE FILEPATH "CUDA compiler")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        # One architecture keeps nvcc's compile time down; the H200 is sm_90.
        set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to compile for (H100/H200: 90)")
      endif()
      if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
        # Same host compiler as the C++ code, so both see one standard library.
        set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "nvcc host compiler")
      endif()
      enable_language(CUDA)
      set(CCLITE_CUDA_LANGUAGE ON)
      message(STATUS "cclite: CUDA ${CUDAToolkit_VERSION}, nvcc ${CMAKE_CUDA_COMPILER}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      message(STATUS "cclite: CUDA Toolkit ${CUDAToolkit_VERSION} found but no nvcc: device kernels are not built "
        "(install the toolkit's nvcc or pass -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)")
    endif()
  else()
    message(STATUS "cclite: CUDA disabled: CUDA Toolkit not found (install it under /usr/local/cuda or pass "
      "-DCUDAToolkit_ROOT=...; -DCCLITE_WITH_CUDA=OFF silences this)")
  endif()
endif()
