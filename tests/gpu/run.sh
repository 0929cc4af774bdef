#!/usr/bin/env bash
# tests/gpu/run.sh - every GPU test and GPU benchmark of cclite, on one machine
# with an NVIDIA GPU (written for an H200 with CUDA 13 and NCCL under
# /usr/local/cuda), in a few minutes; a short table last.
#
#   tests/gpu/run.sh              build into build-gpu/ (BUILD=dir to change), run, print
#   CUDA_ARCH=80 tests/gpu/run.sh for another GPU (default 90: H100/H200)
#   tests/gpu/run.sh --table build-gpu/results.txt   re-print the table of a run
#   DIRECT_BUILD=1 tests/gpu/run.sh   skip CMake: nvcc/g++ build the GPU programs (no
#                        cuda_test); what happens anyway without cmake or doctest
#   PREBUILT=1 BUILD=dir tests/gpu/run.sh   build nothing: run the programs already in
#                        dir/bin (built elsewhere with CMake, -DCMAKE_CUDA_ARCHITECTURES=90,
#                        e.g. copied from build/bin to a GPU machine that lacks the
#                        Debian packages; its CUDA libraries must be on LD_LIBRARY_PATH)
#
# What it runs:
#   cuda_test            doctest: device detection, pointer kinds, error statuses,
#                        CCLITE_GPU_BACKEND, NCCL unique id over the store, CPU
#                        allreduce in the same binary (needs doctest; skipped if absent)
#   reduce_kernels_gpu   every dtype x op of the device reduction kernels, bit for
#                        bit against the host kernels; their bandwidth as a % of a
#                        device-to-device copy measured in the same run
#   ipc_gpu              2 processes sharing the GPU: CUDA IPC handles over the store,
#                        direct allreduce reading the peer's memory, every dtype x op,
#                        and its busbw at 256 MiB
#   staging_gpu          2 processes sharing the GPU, device buffers through the CPU
#                        communicator (shm) staged in pinned host chunks, every dtype x
#                        op, and its busbw at 256 MiB
#   nccl_gpu check N     every collective x dtype (x op) through cclite::nccl::backend
#                        on device buffers, N = 1 process per GPU (NCCL allows one
#                        rank per GPU, so 2 processes sharing a GPU are not possible
#                        with NCCL; that path belongs to the CUDA IPC transport)
#   nccl_gpu perf        NCCL allreduce of 256 MiB float (time, algbw, busbw)
#   nccl_gpu missing_rank a rank that never joins: timeout after 5 s, no hang
#   device_comm_gpu      cclite::cuda::device_communicator: 2 processes sharing the GPU
#                        (native engine, both paths: CUDA IPC (ipc_engine.hpp) and host
#                        staging; each: stream-ordered allreduce of every dtype x op;
#                        broadcast, reduce, allgather, reduce_scatter, gather, scatter,
#                        alltoall of every dtype (x op), stream-ordered and blocking,
#                        several staging chunks per call; allgatherv / alltoallv ragged;
#                        send / recv / sendrecv; five back to back on one stream;
#                        device_buffers in the communicator; argument checks and the host
#                        path; the call returning while the stream is busy, the blocking
#                        form routed by pointer; auto -> native over IPC; 256 MiB busbw
#                        of each path; GPU 0's NVLinks per NVML), then 1
#                        process with the NCCL engine (the same collective checks)
#   data_parallel_gpu    train::data_parallel on device gradients (cuda/device_data_parallel.hpp):
#                        2 processes sharing the GPU train a cuBLAS network 20 steps, parameters
#                        and gradients on the device; rank 0's initial values everywhere, ranks
#                        bitwise equal, within 1e-4 of a 1-process run; stream-ordered waits
#                        return while the GPU is busy; host_wait + no_sync micro-batches
#   hello_device         samples/hello_device_allreduce on 2 ranks sharing the GPU
#   hello_device_nvcc    the same sample compiled as a .cu file by nvcc (CMake build)
#   device_perf          tests/gpu/device_perf.sh sweep: bench/device_allreduce_perf
#                        (nccl-tests columns) 1-256 MiB on the native engine's ipc and
#                        staged paths, 2 ranks sharing the GPU, and NCCL beside them
#                        when there are 2+ GPUs (CMake build only)
#   nproc_gpu            cclite-run --nproc-per-node gpu starts one worker per GPU the
#                        driver lists (/proc/driver/nvidia/gpus)
#   train_cuda           tests/gpu/train_cuda.sh: samples/train_fashion_mnist_cuda, 1 epoch
#                        on 2 ranks sharing the GPU via cclite-run, test accuracy > 0.8
#                        (skipped without the dataset: FASHION_MNIST_DIR)
# Exit status: 0 all passed, 1 a failure, 77 nothing failed but no GPU was found.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build-gpu}
CUDA=${CUDA_HOME:-/usr/local/cuda}
ARCH=${CUDA_ARCH:-90}
JOBS=$(nproc 2>/dev/null || echo 4)
LOG=$BUILD/run.log
T0=$(date +%s)
mkdir -p "$BUILD"
export PATH="$CUDA/bin:$PATH"
export LD_LIBRARY_PATH="$CUDA/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CCLITE_TIMEOUT=${CCLITE_TIMEOUT:-120}

say() { echo "[gpu $(( $(date +%s) - T0 ))s] $*"; }

say "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"

# ---- table ---------------------------------------------------------------------
print_table() {  # results file
  local RES=$1
  echo
  echo "== cclite GPU results ($(date -u +%F), $(( $(date +%s) - T0 )) s, built with $built_with) =="
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  nvcc --version 2>/dev/null | grep release | sed 's/^/nvcc: /'
  grep -h '^nccl_gpu: NCCL' "$(dirname "$RES")"/nccl_check.out 2>/dev/null | head -n1
  echo
  echo "Collectives on device buffers, NCCL backend, ${NCCL_RANKS:-1} process(es) (every op for the reducing ones; ok = bit-exact):"
  awk '$1=="RESULT" && $2=="nccl" && NF>=5 && $3!="check_ranks" && $3!="host_pointer_rejected" && $3!="missing_rank" {
         if (!($4 in seen)) { seen[$4]=1; order[++nd]=$4 }
         if (!($3 in cseen)) { cseen[$3]=1; corder[++nc]=$3 }
         v[$3,$4]=$5 }
       END { if (nd==0) { print "  (no results)"; exit }
             printf "  %-9s", "dtype"; for (c=1;c<=nc;c++) printf " %-14s", corder[c]; print ""
             for (d=1;d<=nd;d++) { printf "  %-9s", order[d]; for (c=1;c<=nc;c++) printf " %-14s", v[corder[c],order[d]]; print "" } }' "$RES"
  grep -h '^RESULT nccl host_pointer_rejected' "$RES" | sed 's/^RESULT nccl /  /'
  echo
  echo "2 processes sharing the GPU (every op; ok = bit-exact): CUDA IPC (handles over the store, direct allreduce) and host staging:"
  awk '$1=="RESULT" && $2=="ipc" && $3=="allreduce" { line = line sprintf(" %s:%s", $4, $5) } END { print "  ipc     " (line ? line : " (no results)") }' "$RES"
  awk '$1=="RESULT" && $2=="staged" && $3=="allreduce" { line = line sprintf(" %s:%s", $4, $5) } END { print "  staged  " (line ? line : " (no results)") }' "$RES"
  awk '$1=="RESULT" && $2=="staged_allreduce_perf" { printf "  staged allreduce %d MiB float sum, 2 ranks on 1 GPU via pinned host + shm: %.1f us, algbw %.1f GB/s, busbw %.1f GB/s\n", $3/1048576, $5, $6, $7 }' "$RES"
  awk '$1=="RESULT" && $2=="ipc_allreduce_perf" { printf "  allreduce %d MiB float sum, 2 ranks on 1 GPU: %.1f us per call (incl. a host barrier), algbw %.1f GB/s, busbw %.1f GB/s\n", $3/1048576, $5, $6, $7 }' "$RES"
  echo
  echo "cclite::cuda::device_communicator (device buffers, every dtype; every op for allreduce, reduce, reduce_scatter;"
  echo "  engines: ipc = native over CUDA IPC, staged = native through pinned host memory, nccl;"
  echo "  allreduce stream-ordered, the others stream-ordered and blocking; ok = bit-exact):"
  awk '$1=="RESULT" && $2=="devcomm" && $3 ~ /^[a-z]+_(allreduce|broadcast|reduce|allgather|reduce_scatter|gather|scatter|alltoall|send_recv|allgatherv|alltoallv)$/ {
         k=$3; e=k; sub(/_.*/, "", e); c=substr(k, length(e) + 2)
         if (!(k in line)) order[++n]=k
         line[k] = line[k] sprintf(" %s:%s", $4, $5); eng[k]=e; coll[k]=c }
       END { if (!n) print "  (no results)"; for (i=1;i<=n;i++) printf "  %-7s%-15s%s\n", eng[order[i]], coll[order[i]], line[order[i]] }' "$RES"
  awk '$1=="RESULT" && $2=="devcomm" && $3 !~ /^[a-z]+_(allreduce|broadcast|reduce|allgather|reduce_scatter|gather|scatter|alltoall|send_recv|allgatherv|alltoallv)$/ { $1=""; $2=""; sub(/^  /, ""); print "  " $0 }' "$RES"
  awk '$1=="RESULT" && $2=="devcomm_allreduce_perf" { printf "  stream-ordered native allreduce (%s path) %d MiB float sum, 2 ranks on 1 GPU: %.1f us, algbw %.1f GB/s, busbw %.1f GB/s\n", $3, $4/1048576, $6, $7, $8 }' "$RES"
  echo
  echo "device_allreduce_perf (bench/, nccl-tests columns; float sum; busbw GB/s out of place / in place; 2 ranks"
  echo "  share the GPU on the native paths; nccl only with 2+ GPUs, one each):"
  awk '$1=="RESULT" && $2=="devperf" { printf "  %-14s %d ranks %10d B  %9.1f us  busbw %7.1f / %7.1f  #wrong %d\n", $3, $4, $5, $6, $7, $8, $9; n++ }
       END { if (!n) print "  (no results)" }' "$RES"
  echo
  echo "train::data_parallel on device gradients (cuda/device_data_parallel.hpp; 2 processes sharing the GPU, native engine):"
  awk '$1=="RESULT" && $2=="dpgpu" { $1=""; $2=""; sub(/^  /, ""); print "  " $0; n++ } END { if (!n) print "  (no results)" }' "$RES"
  grep -h '^RESULT train_cuda' "$RES" | sed 's/^RESULT train_cuda /  GPU trainer sample (data_parallel + device_comm_adapter): /'
  echo
  echo "Device reduction kernels (every op; aligned and misaligned; in place and not; bit-exact vs host):"
  awk '$1=="RESULT" && $2=="kernel" { line = line sprintf(" %s:%s", $3, $4) } END { print "  " (line ? line : " (no results)") }' "$RES"
  awk '$1=="RESULT" && $2=="kernel_bw" { printf "  out = a + b, %-8s: %7.1f GB/s = %5.1f%% of device-to-device copy (%.1f GB/s, same run; goal >= 85%%)\n", $3, $5, $7, $6 }' "$RES"
  echo
  awk '$1=="RESULT" && $2=="nccl_allreduce_perf" { printf "NCCL allreduce %d MiB float sum, %d rank(s): %.1f us, algbw %.1f GB/s, busbw %.1f GB/s%s\n", $3/1048576, $4, $5, $6, $7, ($4==1 ? " (busbw factor 2(n-1)/n is 0 for one rank)" : "") }' "$RES"
  grep -h '^RESULT nccl missing_rank' "$RES" | sed 's/^RESULT nccl /NCCL /'
  if grep -q '^DETAIL' "$RES"; then
    echo
    echo "Wrong results in detail (the first few per program):"
    grep -h '^DETAIL' "$RES" | sed 's/^DETAIL /  /' | head -n 24
  fi
  echo
  echo "Steps:"
  awk '$1=="RESULT" && $2=="step" { printf "  %-20s %s\n", $3, $4 }' "$RES"
  echo "Full log: $LOG"
}

if [ "${1:-}" = "--table" ]; then built_with=earlier; print_table "$2"; exit 0; fi  # re-print saved results
: > "$LOG"

# ---- build: CMake when its dependencies are here, else nvcc/g++ directly ---------
built_with=none
if [ "${PREBUILT:-0}" = 1 ]; then
  built_with=prebuilt
  # cuda_test's stand-in NVML, where its build path does not exist
  [ -f "$BUILD/bin/libcclite_fake_nvml.so" ] && export CCLITE_TEST_FAKE_NVML="$BUILD/bin/libcclite_fake_nvml.so"
fi
have_doctest=0
{ [ -f /usr/include/doctest/doctest.h ] || [ -f /usr/local/include/doctest/doctest.h ]; } && have_doctest=1
if [ $built_with = none ] && command -v cmake >/dev/null && [ $have_doctest = 1 ] && [ "${DIRECT_BUILD:-0}" != 1 ]; then
  tcp=ON
  say "cmake configure (tcp=$tcp, arch=$ARCH)"
  if cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
       -DCMAKE_CUDA_COMPILER="$CUDA/bin/nvcc" -DCCLITE_WITH_TCP=$tcp -DCCLITE_BUILD_SAMPLES=ON \
       -DCCLITE_BUILD_BENCH=ON -DCCLITE_BUILD_TOOLS=ON -DCCLITE_HEADER_CHECK=OFF >>"$LOG" 2>&1 &&
     cmake --build "$BUILD" -j"$JOBS" --target cuda_test reduce_kernels_gpu ipc_gpu staging_gpu nccl_gpu >>"$LOG" 2>&1; then
    built_with=cmake
    # Optional parts: a failure here costs only their steps (NOT_BUILT).
    cmake --build "$BUILD" -j"$JOBS" --target device_comm_gpu >>"$LOG" 2>&1 || say "device_comm_gpu not built (see $LOG)"
    cmake --build "$BUILD" -j"$JOBS" --target data_parallel_gpu >>"$LOG" 2>&1 ||
      say "data_parallel_gpu not built (needs cuBLAS; see $LOG)"
    cmake --build "$BUILD" -j"$JOBS" --target cclite-run train_fashion_mnist_cuda >>"$LOG" 2>&1 ||
      say "train_fashion_mnist_cuda / cclite-run not built (needs zlib and cuBLAS; see $LOG)"
    cmake --build "$BUILD" -j"$JOBS" --target device_allreduce_perf hello_device_allreduce >>"$LOG" 2>&1 ||
      say "device_allreduce_perf / hello_device_allreduce not built (see $LOG)"
    cmake --build "$BUILD" -j"$JOBS" --target hello_device_nvcc >>"$LOG" 2>&1 || say "hello_device_nvcc not built (see $LOG)"
  else
    say "cmake build failed (see $LOG); trying nvcc/g++ directly"
  fi
fi
BIN=$BUILD/bin
if [ $built_with = none ]; then
  mkdir -p "$BIN"
  INC="-I$ROOT/include -I$ROOT/transports/cuda/include -I$ROOT/transports/nccl/include -I$ROOT/tests/gpu -I$CUDA/include"
  say "direct build (nvcc sm_$ARCH, g++)"
  # The device kernels for g++-compiled programs (cuda/device_reduce.hpp).
  nvcc -std=c++17 -O3 -arch=sm_"$ARCH" -diag-suppress=1675,2810 $INC -DCCLITE_HAS_CUDA=1 -Xcompiler -fPIC \
       -c "$ROOT/transports/cuda/src/device_reduce.cu" -o "$BIN/device_reduce.o" >>"$LOG" 2>&1
  nvcc -std=c++17 -O3 -arch=sm_"$ARCH" -diag-suppress=1675,2810 $INC -DCCLITE_HAS_CUDA=1 \
       "$ROOT/tests/gpu/reduce_kernels_gpu.cu" -o "$BIN/reduce_kernels_gpu" >>"$LOG" 2>&1 &
  nvcc -std=c++17 -O3 -arch=sm_"$ARCH" -diag-suppress=1675,2810 $INC -DCCLITE_HAS_CUDA=1 \
       "$ROOT/tests/gpu/ipc_gpu.cu" -ldl -o "$BIN/ipc_gpu" >>"$LOG" 2>&1 &
  g++ -std=c++17 -O2 $INC -DCCLITE_HAS_CUDA=1 -DCCLITE_HAS_NCCL=1 "$ROOT/tests/gpu/nccl_gpu.cpp" \
      -L"$CUDA/lib64" -lnccl -lcudart -ldl -pthread -Wl,-rpath,"$CUDA/lib64" -o "$BIN/nccl_gpu" >>"$LOG" 2>&1
  # shm only: default_communicator = communicator<shm::transport>.
  g++ -std=c++17 -O2 $INC -I"$ROOT/transports/shm/include" -DCCLITE_HAS_CUDA=1 -DCCLITE_HAS_SHM=1 \
      "$ROOT/tests/gpu/staging_gpu.cpp" -L"$CUDA/lib64" -lcudart -lrt -ldl -pthread -Wl,-rpath,"$CUDA/lib64" \
      -o "$BIN/staging_gpu" >>"$LOG" 2>&1
  g++ -std=c++17 -O2 $INC -I"$ROOT/transports/shm/include" -DCCLITE_HAS_CUDA=1 -DCCLITE_HAS_SHM=1 -DCCLITE_HAS_NCCL=1 \
      "$ROOT/tests/gpu/device_comm_gpu.cpp" "$BIN/device_reduce.o" -L"$CUDA/lib64" -lnccl -lcudart -lrt -ldl -pthread -Wl,-rpath,"$CUDA/lib64" \
      -o "$BIN/device_comm_gpu" >>"$LOG" 2>&1
  g++ -std=c++17 -O2 $INC -I"$ROOT/transports/shm/include" -DCCLITE_HAS_CUDA=1 -DCCLITE_HAS_SHM=1 \
      "$ROOT/tests/gpu/data_parallel_gpu.cpp" "$BIN/device_reduce.o" -L"$CUDA/lib64" -lcublas -lcudart -lrt -ldl -pthread \
      -Wl,-rpath,"$CUDA/lib64" -o "$BIN/data_parallel_gpu" >>"$LOG" 2>&1
  wait
  built_with=direct
fi
say "built ($built_with)"

# ---- run -----------------------------------------------------------------------
RES=$BUILD/results.txt
: > "$RES"
fails=0
run() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2
  if [ ! -x "$1" ]; then
    if [ "$name" = cuda_test ] && [ $built_with = direct ]; then  # needs doctest + CMake
      echo "RESULT step $name SKIPPED_NO_DOCTEST" >> "$RES"; say "$name: skipped (direct build)"; return
    fi
    echo "RESULT step $name NOT_BUILT" >> "$RES"; fails=$((fails + 1)); say "$name: not built"; return
  fi
  say "run $name"
  timeout "$secs" "$@" > "$BUILD/$name.out" 2>&1
  local rc=$?
  cat "$BUILD/$name.out" >> "$LOG"
  grep -E '^(RESULT|DETAIL)' "$BUILD/$name.out" >> "$RES"
  local verdict=ok
  case $rc in 0) ;; 77) verdict=SKIPPED_NO_GPU ;; 124) verdict=TIMEOUT; fails=$((fails + 1)) ;; *) verdict="FAIL(rc=$rc)"; fails=$((fails + 1)) ;; esac
  echo "RESULT step $name $verdict" >> "$RES"
  [ "$verdict" = ok ] || { say "$name: $verdict"; tail -n 20 "$BUILD/$name.out"; }
}
# Hang guards, not expectations (each normally takes seconds): a hung step costs
# its guard, so a run with one hang still ends, and prints the table.
run cuda_test 60 "$BIN/cuda_test"
run reduce_kernels_gpu 60 "$BIN/reduce_kernels_gpu"
run ipc_gpu 60 "$BIN/ipc_gpu"
run staging_gpu 60 "$BIN/staging_gpu"
run nccl_check 60 "$BIN/nccl_gpu" check "${NCCL_RANKS:-1}"
run nccl_perf 45 "$BIN/nccl_gpu" perf $((256 << 20))
run nccl_missing_rank 30 "$BIN/nccl_gpu" missing_rank
run device_comm_gpu 180 "$BIN/device_comm_gpu"  # both native paths
run data_parallel_gpu 60 "$BIN/data_parallel_gpu"
if [ -x "$BIN/hello_device_allreduce" ] && [ -x "$BIN/cclite-run" ]; then
  run hello_device 60 "$BIN/cclite-run" --nproc-per-node 2 "$BIN/hello_device_allreduce"
elif [ $built_with = direct ]; then
  echo "RESULT step hello_device SKIPPED_DIRECT_BUILD" >> "$RES"; say "hello_device: skipped (direct build)"
else
  echo "RESULT step hello_device NOT_BUILT" >> "$RES"; fails=$((fails + 1)); say "hello_device: not built"
fi
if [ -x "$BIN/hello_device_nvcc" ] && [ -x "$BIN/cclite-run" ]; then  # the same sample compiled by nvcc
  run hello_device_nvcc 60 "$BIN/cclite-run" --nproc-per-node 2 "$BIN/hello_device_nvcc"
fi
if [ -x "$BIN/device_allreduce_perf" ] && [ -x "$BIN/cclite-run" ]; then
  run device_perf 240 "$ROOT/tests/gpu/device_perf.sh" "$BIN/device_allreduce_perf" "$BIN/cclite-run" sweep
elif [ $built_with = direct ]; then
  echo "RESULT step device_perf SKIPPED_DIRECT_BUILD" >> "$RES"; say "device_perf: skipped (direct build)"
else
  echo "RESULT step device_perf NOT_BUILT" >> "$RES"; fails=$((fails + 1)); say "device_perf: not built"
fi
if [ -x "$BIN/cclite-run" ]; then  # --nproc-per-node gpu: one worker per GPU the driver lists
  run nproc_gpu 30 /bin/sh -c 'n=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l); [ "$n" -gt 0 ] || exit 77
    out=$("$0" --nproc-per-node gpu /bin/sh -c "echo \$LOCAL_WORLD_SIZE"); echo "$out"
    c=$(echo "$out" | grep -c ": $n\$"); echo "RESULT nproc_gpu workers=$c gpus=$n"; [ "$c" = "$n" ]' "$BIN/cclite-run"
fi
if [ -x "$BIN/train_fashion_mnist_cuda" ] && [ -x "$BIN/cclite-run" ]; then
  run train_cuda 300 "$ROOT/tests/gpu/train_cuda.sh" "$BIN/train_fashion_mnist_cuda" "$BIN/cclite-run"
elif [ $built_with = direct ]; then
  echo "RESULT step train_cuda SKIPPED_DIRECT_BUILD" >> "$RES"; say "train_cuda: skipped (direct build)"
else
  echo "RESULT step train_cuda NOT_BUILT" >> "$RES"; fails=$((fails + 1)); say "train_cuda: not built"
fi

print_table "$RES"
skips=$(grep -c 'SKIPPED_NO_GPU' "$RES")
if [ "$fails" = 0 ] && [ "$skips" -gt 0 ]; then
  echo "NO GPU: $skips step(s) skipped; run this on a machine with an NVIDIA GPU"
  exit 77
fi
exit $(( fails > 0 ))
