# GPU tests (included by tests/CMakeLists.txt). Built whenever the CUDA Toolkit
# is found, so CI compiles and links every GPU file on every run even without a GPU.
#
#   cuda_test            ctest; runs everywhere: without a device it checks the
#                        clean 'no CUDA device' status and that CPU collectives work
#                        in the same binary; with NCCL also the unique-id bootstrap
#                        and the NCCL backend's no-device error; NVML's loader and
#                        NVLink count against cclite_fake_nvml (a stand-in library)
#   cclite_header_check_gpu   every cuda/nccl .hpp on its own, twice (-fno-exceptions
#                        -fno-rtti the second time); part of ctest's header_check
#   reduce_kernels_gpu, ipc_gpu (nvcc), staging_gpu, nccl_gpu, device_comm_gpu,
#   data_parallel_gpu (g++, cuBLAS)
#                        need a GPU: built here on every run, run by tests/gpu/run.sh
#   train_fashion_mnist_cuda (ctest, train_cuda.sh): the GPU sample's clean 'no CUDA
#                        device' exit here; 1 epoch on 2 ranks sharing the GPU there
if(NOT TARGET cclite_cuda)
  return()
endif()

add_executable(cuda_test ${CMAKE_CURRENT_LIST_DIR}/cuda_test.cpp)
target_link_libraries(cuda_test PRIVATE cclite_test_main cclite_cuda)
if(TARGET cclite_nccl)
  target_link_libraries(cuda_test PRIVATE cclite_nccl)
endif()
if(TARGET cclite_cuda_kernels)
  target_compile_definitions(cuda_test PRIVATE CCLITE_TEST_KERNELS_LINKED=1)
endif()
# A stand-in libnvidia-ml (no driver here) for cuda/nvml.hpp's loader and link count.
add_library(cclite_fake_nvml SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nvml.cpp)
set_target_properties(cclite_fake_nvml PROPERTIES CXX_VISIBILITY_PRESET default)
add_dependencies(cuda_test cclite_fake_nvml)
target_compile_definitions(cuda_test PRIVATE CCLITE_TEST_FAKE_NVML="$<TARGET_FILE:cclite_fake_nvml>")
add_test(NAME cuda_test COMMAND cuda_test)
set_tests_properties(cuda_test PROPERTIES TIMEOUT ${CCLITE_TEST_TIMEOUT} LABELS "gpu")

# Device kernels: compiled by nvcc (every dtype x op of reduce_kernels.cuh).
if(CCLITE_CUDA_LANGUAGE)
  add_executable(reduce_kernels_gpu ${CMAKE_CURRENT_LIST_DIR}/reduce_kernels_gpu.cu)
  target_link_libraries(reduce_kernels_gpu PRIVATE cclite_cuda)
  set_target_properties(reduce_kernels_gpu PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  # Two processes on one GPU through CUDA IPC handles exchanged over the store.
  add_executable(ipc_gpu ${CMAKE_CURRENT_LIST_DIR}/ipc_gpu.cu)
  target_link_libraries(ipc_gpu PRIVATE cclite_cuda)
  set_target_properties(ipc_gpu PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
endif()

# The NCCL backend on device buffers (host code; g++ compiles it).
if(TARGET cclite_nccl)
  add_executable(nccl_gpu ${CMAKE_CURRENT_LIST_DIR}/nccl_gpu.cpp)
  target_link_libraries(nccl_gpu PRIVATE cclite_core cclite_nccl)
  target_compile_options(nccl_gpu PRIVATE -Wall -Wextra)
endif()

# Device buffers through the CPU communicator, staged in pinned host memory (g++).
add_executable(staging_gpu ${CMAKE_CURRENT_LIST_DIR}/staging_gpu.cpp)
target_link_libraries(staging_gpu PRIVATE cclite::cclite cclite_cuda)
target_compile_options(staging_gpu PRIVATE -Wall -Wextra)

# cclite::cuda::device_communicator on device buffers: 2 processes sharing the
# GPU (native engine), 1 process with NCCL (g++: the engine is host code).
if(TARGET cclite::shm OR TARGET cclite::tcp)
  add_executable(device_comm_gpu ${CMAKE_CURRENT_LIST_DIR}/device_comm_gpu.cpp)
  target_link_libraries(device_comm_gpu PRIVATE cclite::cclite cclite_cuda)
  if(TARGET cclite_nccl)
    target_link_libraries(device_comm_gpu PRIVATE cclite_nccl)
  endif()
  target_compile_options(device_comm_gpu PRIVATE -Wall -Wextra)
endif()

# device_comm_gpu's host-side logic on a stand-in CUDA runtime (emulated_cudart.cpp:
# host memory; everything at once on the calling thread, or each stream on a
# thread of its own), so that the engines' chunking, handle exchanges, call
# sequences and stream ordering run between real processes here. Not a GPU test:
# it says nothing about kernels, real CUDA IPC or speed.
if(TARGET cclite::shm)
  add_library(cclite_emulated_cudart SHARED ${CMAKE_CURRENT_LIST_DIR}/emulated_cudart.cpp)
  target_include_directories(cclite_emulated_cudart PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cclite_emulated_cudart PRIVATE cclite_core)
  set_target_properties(cclite_emulated_cudart PROPERTIES CXX_VISIBILITY_PRESET default)
  add_executable(device_comm_emulated ${CMAKE_CURRENT_LIST_DIR}/device_comm_gpu.cpp)
  target_include_directories(device_comm_emulated PRIVATE ${PROJECT_SOURCE_DIR}/transports/cuda/include
                             ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(device_comm_emulated PRIVATE CCLITE_HAS_CUDA=1 CCLITE_TEST_EMULATED_CUDA=1)
  target_link_libraries(device_comm_emulated PRIVATE cclite::cclite cclite_emulated_cudart)
  add_test(NAME device_comm_emulated COMMAND device_comm_emulated)
  # The same with every stream on a thread of its own, running later than issued
  # (emulated_cudart.cpp's asynchronous mode): a missing event wait or an engine
  # reading a result its stream has not produced yet gives wrong bytes there.
  add_test(NAME device_comm_emulated_async COMMAND device_comm_emulated)
  set_tests_properties(device_comm_emulated_async PROPERTIES ENVIRONMENT CCLITE_EMULATED_ASYNC=1)
  set_tests_properties(device_comm_emulated device_comm_emulated_async PROPERTIES TIMEOUT ${CCLITE_TEST_TIMEOUT} LABELS "gpu")
  # data_parallel on device gradients the same way, its cuBLAS calls on the host too.
  add_library(cclite_emulated_cublas SHARED ${CMAKE_CURRENT_LIST_DIR}/emulated_cublas.cpp)
  target_include_directories(cclite_emulated_cublas PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cclite_emulated_cublas PRIVATE cclite_emulated_cudart)  # its calls go through streams
  set_target_properties(cclite_emulated_cublas PROPERTIES CXX_VISIBILITY_PRESET default)
  add_executable(data_parallel_emulated ${CMAKE_CURRENT_LIST_DIR}/data_parallel_gpu.cpp)
  target_include_directories(data_parallel_emulated PRIVATE ${PROJECT_SOURCE_DIR}/transports/cuda/include
                             ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(data_parallel_emulated PRIVATE CCLITE_HAS_CUDA=1 CCLITE_TEST_EMULATED_CUDA=1)
  target_link_libraries(data_parallel_emulated PRIVATE cclite::cclite cclite_emulated_cudart cclite_emulated_cublas)
  add_test(NAME data_parallel_emulated COMMAND data_parallel_emulated)
  add_test(NAME data_parallel_emulated_async COMMAND data_parallel_emulated)
  set_tests_properties(data_parallel_emulated_async PROPERTIES ENVIRONMENT CCLITE_EMULATED_ASYNC=1)
  set_tests_properties(data_parallel_emulated data_parallel_emulated_async PROPERTIES TIMEOUT ${CCLITE_TEST_TIMEOUT} LABELS "gpu")
  # The two whole GPU programs the same way, 2 ranks through cclite-run: the
  # README's device sample must print "correct" on both native paths, and
  # device_allreduce_perf's check sweep must report #wrong 0 (its times are the
  # host's and mean nothing).
  if(TARGET cclite-run)
    set(_emulated_hello ${PROJECT_SOURCE_DIR}/samples/hello_device_allreduce.cpp)
    set(_emulated_perf ${PROJECT_SOURCE_DIR}/bench/device_allreduce_perf.cpp)
    foreach(_prog hello_device_emulated device_allreduce_perf_emulated)
      if(_prog STREQUAL hello_device_emulated)
        add_executable(${_prog} ${_emulated_hello})
      else()
        add_executable(${_prog} ${_emulated_perf})
        target_include_directories(${_prog} PRIVATE ${PROJECT_SOURCE_DIR}/bench)
      endif()
      target_include_directories(${_prog} PRIVATE ${PROJECT_SOURCE_DIR}/transports/cuda/include
                                 ${CUDAToolkit_INCLUDE_DIRS})
      target_compile_definitions(${_prog} PRIVATE CCLITE_HAS_CUDA=1)
      target_link_libraries(${_prog} PRIVATE cclite::cclite cclite_emulated_cudart)
    endforeach()
    add_test(NAME hello_device_emulated
      COMMAND ${CMAKE_CURRENT_LIST_DIR}/emulated_run.sh correct $<TARGET_FILE:cclite-run> --nproc-per-node 2
              $<TARGET_FILE:hello_device_emulated>)
    add_test(NAME device_allreduce_perf_emulated
      COMMAND ${CMAKE_CURRENT_LIST_DIR}/device_perf.sh $<TARGET_FILE:device_allreduce_perf_emulated>
              $<TARGET_FILE:cclite-run> emulated)
    set_tests_properties(hello_device_emulated device_allreduce_perf_emulated PROPERTIES TIMEOUT 300 LABELS "gpu"
                         ENVIRONMENT CCLITE_EMULATED_ASYNC=1)  # streams on threads, as on a GPU
  endif()
endif()

# nvcc compiles cclite's CPU headers too (a .cu file of a program may include
# <cclite/cclite.hpp>): samples/hello_allreduce.cpp as a CUDA translation unit,
# run on 2 ranks through cclite-run. Needs no GPU: its code is host code.
if(CCLITE_CUDA_LANGUAGE AND TARGET cclite-run AND TARGET cclite::shm)
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/hello_allreduce_nvcc.cu CONTENT
    "// Generated by tests/gpu/gpu.cmake: samples/hello_allreduce.cpp compiled by nvcc.\n#include \"${PROJECT_SOURCE_DIR}/samples/hello_allreduce.cpp\"\n")
  add_executable(hello_allreduce_nvcc ${CMAKE_CURRENT_BINARY_DIR}/hello_allreduce_nvcc.cu)
  target_link_libraries(hello_allreduce_nvcc PRIVATE cclite::cclite)
  set_target_properties(hello_allreduce_nvcc PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  add_test(NAME hello_allreduce_nvcc
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/emulated_run.sh correct $<TARGET_FILE:cclite-run> --nproc-per-node 2
            $<TARGET_FILE:hello_allreduce_nvcc>)
  set_tests_properties(hello_allreduce_nvcc PROPERTIES TIMEOUT 120)
  # The GPU sample as a .cu file too (the CPU and CUDA headers in one CUDA
  # translation unit, as a program with its own kernels has them): built here,
  # run where there is a GPU (tests/gpu/run.sh runs the g++ build).
  if(TARGET cclite_cuda)
    file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/hello_device_nvcc.cu CONTENT
      "// Generated by tests/gpu/gpu.cmake: samples/hello_device_allreduce.cpp compiled by nvcc.\n#include \"${PROJECT_SOURCE_DIR}/samples/hello_device_allreduce.cpp\"\n")
    add_executable(hello_device_nvcc ${CMAKE_CURRENT_BINARY_DIR}/hello_device_nvcc.cu)
    target_link_libraries(hello_device_nvcc PRIVATE cclite::cclite cclite::cuda)
    if(TARGET cclite::nccl)
      target_link_libraries(hello_device_nvcc PRIVATE cclite::nccl)
    endif()
    set_target_properties(hello_device_nvcc PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  endif()
endif()

# train::data_parallel on device gradients (cuda/device_data_parallel.hpp): 2
# processes sharing the GPU train with cuBLAS; ranks bitwise equal, close to 1 rank.
if((TARGET cclite::shm OR TARGET cclite::tcp) AND TARGET CUDA::cublas)
  add_executable(data_parallel_gpu ${CMAKE_CURRENT_LIST_DIR}/data_parallel_gpu.cpp)
  target_link_libraries(data_parallel_gpu PRIVATE cclite::cclite cclite_cuda CUDA::cublas)
  target_compile_options(data_parallel_gpu PRIVATE -Wall -Wextra)
endif()

# Header self-containment for the GPU parts (the .hpp files; .cuh need nvcc and
# are compiled by reduce_kernels_gpu): each on its own, with cclite::cuda /
# cclite::nccl's requirements, once as is and once -fno-exceptions -fno-rtti.
# Joins tests/header_check.cmake's cclite_header_check (ctest header_check).
set(_gpu_hc_dir "${CMAKE_CURRENT_BINARY_DIR}/header_check_gpu")
set(_gpu_hc_sources "")
foreach(_gpu_part cuda nccl)
  if(NOT TARGET cclite_${_gpu_part})
    continue()
  endif()
  file(GLOB _gpu_hc_headers RELATIVE "${PROJECT_SOURCE_DIR}/transports/${_gpu_part}/include"
       "${PROJECT_SOURCE_DIR}/transports/${_gpu_part}/include/cclite/${_gpu_part}/*.hpp")
  foreach(_gpu_h IN LISTS _gpu_hc_headers)
    string(REGEX REPLACE "[/.]" "_" _gpu_stem "${_gpu_h}")
    file(CONFIGURE OUTPUT "${_gpu_hc_dir}/${_gpu_stem}.cpp" CONTENT
"// Generated by tests/gpu/gpu.cmake
#include <${_gpu_h}>
#include <${_gpu_h}>
" @ONLY)
    list(APPEND _gpu_hc_sources "${_gpu_hc_dir}/${_gpu_stem}.cpp")
  endforeach()
endforeach()
if(_gpu_hc_sources)
  set(_gpu_hc_libs cclite_cuda)
  if(TARGET cclite_nccl)
    list(APPEND _gpu_hc_libs cclite_nccl)
  endif()
  foreach(_gpu_variant plain noexc)
    add_library(cclite_header_check_gpu_${_gpu_variant} OBJECT EXCLUDE_FROM_ALL ${_gpu_hc_sources})
    target_link_libraries(cclite_header_check_gpu_${_gpu_variant} PRIVATE ${_gpu_hc_libs})
    set_target_properties(cclite_header_check_gpu_${_gpu_variant} PROPERTIES
      CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
    target_compile_options(cclite_header_check_gpu_${_gpu_variant} PRIVATE -Wall -Wextra -Werror -O0)
  endforeach()
  target_compile_options(cclite_header_check_gpu_noexc PRIVATE -fno-exceptions -fno-rtti)
  add_custom_target(cclite_header_check_gpu)
  add_dependencies(cclite_header_check_gpu cclite_header_check_gpu_plain cclite_header_check_gpu_noexc)
  if(TARGET cclite_header_check)
    add_dependencies(cclite_header_check cclite_header_check_gpu)
  endif()
endif()

# The GPU programs are ctest cases too: skipped (exit 77) without a GPU, run with one.
foreach(_gpu_prog reduce_kernels_gpu ipc_gpu staging_gpu device_comm_gpu data_parallel_gpu)
  if(TARGET ${_gpu_prog})
    add_test(NAME ${_gpu_prog} COMMAND ${_gpu_prog})
  endif()
endforeach()
if(TARGET nccl_gpu)
  add_test(NAME nccl_gpu COMMAND nccl_gpu check 1)
  add_test(NAME nccl_gpu_missing_rank COMMAND nccl_gpu missing_rank)
endif()
# The GPU trainer sample (samples/train_fashion_mnist_cuda.cu): without a GPU it
# must exit non-zero saying "no CUDA device" (checked here, on every machine);
# with one, 1 epoch on 2 ranks sharing the GPU through cclite-run must reach a
# test accuracy above 0.8 (skipped, 77, when the dataset is missing).
if(TARGET train_fashion_mnist_cuda AND TARGET cclite-run)
  add_test(NAME train_fashion_mnist_cuda
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/train_cuda.sh $<TARGET_FILE:train_fashion_mnist_cuda> $<TARGET_FILE:cclite-run>)
  set_tests_properties(train_fashion_mnist_cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "gpu")
endif()
# bench/device_allreduce_perf: exit 77 saying "no CUDA device" here; on a GPU, the
# native engine's two paths on 2 ranks sharing it, every #wrong 0.
if(TARGET device_allreduce_perf AND TARGET cclite-run)
  add_test(NAME device_allreduce_perf
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/device_perf.sh $<TARGET_FILE:device_allreduce_perf> $<TARGET_FILE:cclite-run>)
  set_tests_properties(device_allreduce_perf PROPERTIES TIMEOUT 300 LABELS "gpu")
endif()
# samples/hello_device_allreduce on 2 ranks (sharing a GPU, or one each).
if(TARGET hello_device_allreduce AND TARGET cclite-run)
  add_test(NAME hello_device_allreduce
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/no_gpu_or_pass.sh $<TARGET_FILE:cclite-run> --nproc-per-node 2
            $<TARGET_FILE:hello_device_allreduce>)
  set_tests_properties(hello_device_allreduce PROPERTIES TIMEOUT 120 LABELS "gpu")
endif()
foreach(_gpu_prog reduce_kernels_gpu ipc_gpu staging_gpu device_comm_gpu data_parallel_gpu nccl_gpu
                  nccl_gpu_missing_rank)
  if(TEST ${_gpu_prog})
    set_tests_properties(${_gpu_prog} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "gpu")
  endif()
endforeach()
