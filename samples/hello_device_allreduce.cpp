// hello_device_allreduce: hello_allreduce on GPU memory.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/hello_device_allreduce
//
// Each rank fills a cudaMalloc'd vector with its rank number and averages it
// twice: through the communicator's own allreduce (device_buffers: device
// pointers go to the GPU engine, CUDA-aware-MPI style, blocking), and
// stream-ordered through device_communicator (returns at once; the result is
// there for whatever runs on the stream next). The engine: NCCL when every rank
// has a GPU of its own, else cclite's native one (CUDA IPC inside a node, host
// staging otherwise), so two ranks sharing one GPU work too
// (CCLITE_GPU_BACKEND=nccl|native picks it). Without a GPU: "no CUDA device",
// exit code 77.
#include <cclite/cclite.hpp>
#include <cclite/cuda/device_buffers.hpp>  // provides: device_buffers, device_communicator

#include <cuda_runtime.h>  // cudaMalloc(T**, size) among the C++ helpers

#include <cstdio>
#include <vector>

int main() {
  auto env = cclite::init();  // rank, size and rendezvous from the launcher's environment
  if (!env) {
    std::fprintf(stderr, "%s\n", env.error().to_string().c_str());
    return 1;
  }
  cclite::default_communicator& comm = *env.value();
  auto gpu = cclite::cuda::device_buffers<cclite::default_communicator>::enable(comm);  // collective
  if (!gpu) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), gpu.error().to_string().c_str());
    return gpu.error().code() == cclite::errc::unsupported ? 77 : 1;
  }
  auto& dc = gpu.value()->device();

  const std::size_t n = 1 << 20, bytes = n * sizeof(float);
  std::vector<float> host(n, static_cast<float>(comm.rank()));
  float* d = nullptr;
  cudaStream_t s = nullptr;
  auto ok = [&](const cclite::status& st) {
    if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", comm.rank(), st.to_string().c_str());
    return st.ok();
  };
  auto cu = [&](cudaError_t e, const char* what) { return ok(cclite::cuda::cuda_status(e, what)); };
  if (!cu(cudaMalloc(&d, bytes), "cudaMalloc") || !cu(cudaStreamCreate(&s), "cudaStreamCreate") ||
      !cu(cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy")) {
    return 1;
  }
  // 1. The communicator's own call, on device memory: blocking.
  if (!ok(comm.allreduce(d, d, n, cclite::dtype::float32, cclite::reduce_op::avg))) return 1;
  // 2. Stream-ordered: enqueue (returns at once), then wait, bounded by CCLITE_TIMEOUT.
  if (!ok(dc.allreduce(d, d, n, cclite::dtype::float32, cclite::reduce_op::sum, s)) || !ok(dc.synchronize(s))) return 1;
  if (!cu(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
  cudaStreamDestroy(s);
  cudaFree(d);

  // The average of the ranks 0..size-1 is (size-1)/2 on every rank; summed over the ranks:
  const float want = comm.size() * (comm.size() - 1) / 2.0f;
  const bool right = host[0] == want && host[n - 1] == want;
  std::printf("rank %d of %d on GPU %d (%s engine): %g (%s)\n", comm.rank(), comm.size(), dc.device(), dc.path(),
              host[0], right ? "correct" : "WRONG");
  return right ? 0 : 1;
}
