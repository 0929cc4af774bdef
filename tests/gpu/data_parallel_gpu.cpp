// train::data_parallel on device gradients (cclite/cuda/device_data_parallel.hpp)
// on a GPU: 2 processes sharing it (native engine, small staging chunks so a
// bucket spans several) train a 2-layer linear network with cuBLAS for 20 steps
// of a global batch of 32, gradients and parameters in device memory only:
//   - create() replaces every rank's own initial values by rank 0's, bit for bit
//   - 3 buckets (fc2; fc1.bias + half of fc1.weight; the other half), two
//     reduced while backward goes on, the last in synchronize()
//   - after training, both ranks hold bitwise identical parameters, within 1e-4
//     of a 1-process run on the whole batch (a size-1 split of the same job),
//     which itself moved the parameters by far more than that
//   - stream-ordered waits (default): synchronize() returns while the compute
//     stream is still busy (a 200 ms host function ahead of backward)
//   - adapter_options::host_wait with 2 no_sync micro-batches per step (zero_grad
//     through the adapter): after synchronize() the communication stream is idle
// Run by tests/gpu/run.sh (and ctest -L gpu); exit 0 ok, 1 failure, 77 no CUDA device.
// Built against the stand-ins tests/gpu/emulated_cudart.cpp / emulated_cublas.cpp
// it is ctest's data_parallel_emulated (timing checks aside).
#include <cclite/cclite.hpp>
#include <cclite/cuda/device_data_parallel.hpp>
#include <cclite/train/parameter.hpp>
#include <cclite/train/random.hpp>

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "processes.hpp"
#include "reference.hpp"

using namespace cclite;
using device_comm = cuda::device_communicator<default_communicator>;
using adapter = cuda::device_comm_adapter<default_communicator>;

namespace {

#define GPU(expr) OR_DIE(cuda::cuda_status((expr), #expr))

// Built against tests/gpu/emulated_cudart.cpp + emulated_cublas.cpp
// (data_parallel_emulated): no GPU; everything at once on the calling thread, or
// (data_parallel_emulated_async) each stream on a thread of its own, later.
#if defined(CCLITE_TEST_EMULATED_CUDA)
constexpr bool emulated = true;
#else
constexpr bool emulated = false;
#endif
#define BLAS(expr)                                                                      \
  do {                                                                                  \
    if ((expr) != CUBLAS_STATUS_SUCCESS) {                                              \
      std::fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr);             \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

constexpr int in = 32, hid = 64, out = 8, global = 32, steps = 20;
constexpr float lr = 0.05f;

void CUDART_CB sleep_200ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

// The job's data, the same in every process: column j of x is sample j (steps
// x global of them), t = teacher x.
struct dataset {
  std::vector<float> x, t;
  dataset() : x(std::size_t{in} * global * steps), t(std::size_t{out} * global * steps) {
    train::rng g(7);
    std::vector<float> teacher(std::size_t{out} * in);
    for (float& v : teacher) v = g.uniform(-0.3f, 0.3f);
    for (float& v : x) v = g.uniform(-1, 1);
    for (std::size_t j = 0; j < std::size_t{global} * steps; ++j)
      for (int o = 0; o < out; ++o) {
        float s = 0;
        for (int i = 0; i < in; ++i) s += teacher[std::size_t(i) * out + o] * x[j * in + i];
        t[j * out + o] = s;
      }
  }
};

// fc1.weight (hid x in, column-major), fc1.bias, fc2.weight (out x hid), fc2.bias,
// PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from rng(100 + rank).
std::vector<train::parameter> make_model(int rank) {
  std::vector<train::parameter> m;
  m.emplace_back("fc1.weight", std::size_t{hid} * in);
  m.emplace_back("fc1.bias", std::size_t{hid});
  m.emplace_back("fc2.weight", std::size_t{out} * hid);
  m.emplace_back("fc2.bias", std::size_t{out});
  train::rng g(100 + static_cast<std::uint64_t>(rank));
  for (std::size_t k = 0; k < m.size(); ++k) {
    const float a = 1.0f / std::sqrt(static_cast<float>(k < 2 ? in : hid));
    for (float& v : m[k].values()) v = g.uniform(-a, a);
  }
  return m;
}

struct run_cfg {
  const char* name;
  bool host_wait = false;
  int accumulate = 1;  // micro-batches per step, all but the last under no_sync
  bool stall = false;  // step 0: a 200 ms host function on the compute stream before backward
};

struct run_out {
  std::vector<float> init, final;  // flat values (bucket order) after create() and at the end
  int failed = 0;
};

// Trains `steps` steps through data_parallel on `dc`'s ranks (each its share of
// every global batch); device-only parameters and gradients.
run_out train_run(device_comm& dc, const run_cfg& cfg, const float* dx, const float* dt, const float* ones) {
  const int rank = dc.rank(), size = dc.size();
  run_out r;
  auto cs_owner = cuda::stream::create();
  OR_DIE(cs_owner.ok() ? status() : cs_owner.error());
  cudaStream_t cs = cs_owner.value().get();
  cublasHandle_t blas = nullptr;
  BLAS(cublasCreate(&blas));
  BLAS(cublasSetStream(blas, cs));
  cuda::adapter_options ao;
  ao.host_wait = cfg.host_wait;
  auto made_ad = adapter::create(dc, cs, ao);
  OR_DIE(made_ad.ok() ? status() : made_ad.error());
  adapter& ad = *made_ad.value();
  {
    auto model = make_model(rank);
    train::parameter_list pl;
    for (auto& p : model) pl.push_back(&p);
    train::dp_options o;
    o.first_bucket_cap_bytes = 64;  // fc2 alone; fc1 never shares with it
    o.bucket_cap_bytes = 64;
    o.split_bytes = 4096;           // fc1.weight (8 KiB) in 2 pieces
    auto made = cuda::device_data_parallel<default_communicator>::create(ad, pl, o);
    OR_DIE(made.ok() ? status() : made.error());
    auto& ddp = made.value();
    const std::size_t total = ddp.flat_size();
    const bool layout_ok = ddp.buckets().buckets.size() == 3 && !ddp.shared_gradients() && ddp.flat_values() &&
                           ddp.grad(model[0]) && ddp.value(model[3]) && model[0].grad() != ddp.grad(model[0]);
    r.failed += !layout_ok;
    // Every rank now holds rank 0's initial values.
    r.init.resize(total);
    OR_DIE(ad.copy(r.init.data(), ddp.flat_values(), total));
    const auto model0 = make_model(0);
    bool init_ok = true;
    for (std::size_t k = 0; k < model.size(); ++k) {
      std::vector<float> got(model[k].size());
      OR_DIE(ad.copy(got.data(), ddp.value(model[k]), got.size()));
      init_ok = init_ok && std::memcmp(got.data(), model0[k].value(), got.size() * sizeof(float)) == 0;
    }
    r.failed += !init_ok;
    if (rank == 0 || !layout_ok || !init_ok)
      std::printf("RESULT dpgpu %s_%d_rank%s initial_values_from_rank0 %s, 3 buckets %s\n", cfg.name, size,
                  size == 1 ? "" : "s", init_ok ? "ok" : "FAIL", layout_ok ? "ok" : "FAIL");

    auto buf = [&](std::size_t n) {
      auto b = cuda::device_buffer::allocate(n * sizeof(float));
      OR_DIE(b.ok() ? status() : b.error());
      return std::move(b.value());
    };
    cuda::device_buffer h = buf(std::size_t{hid} * global), y = buf(std::size_t{out} * global),
                        dh = buf(std::size_t{hid} * global);
    float* W1 = ddp.value(model[0]);
    float* b1 = ddp.value(model[1]);
    float* W2 = ddp.value(model[2]);
    float* b2 = ddp.value(model[3]);
    float *dW1 = ddp.grad(model[0]), *db1 = ddp.grad(model[1]), *dW2 = ddp.grad(model[2]), *db2 = ddp.grad(model[3]);
    const float one = 1.0f, zero = 0.0f, minus_one = -1.0f, minus_lr = -lr;
    const int B = global / size, micro = B / cfg.accumulate;
    const float scale = 1.0f / static_cast<float>(B);  // local mean; avg over ranks = global mean
    for (int step = 0; step < steps; ++step) {
      for (int m = 0; m < cfg.accumulate; ++m) {
        ddp.set_sync(m + 1 == cfg.accumulate);
        const std::size_t col = std::size_t(step) * global + std::size_t(rank) * B + std::size_t(m) * micro;
        const float* x = dx + col * in;
        const int n = micro;
        // Forward: h = W1 x + b1, y = W2 h + b2; then y = (y - t) / B = dL/dy.
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hid, n, in, &one, W1, hid, x, in, &zero, h.as<float>(), hid));
        BLAS(cublasSger(blas, hid, n, &one, b1, 1, ones, 1, h.as<float>(), hid));
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, out, n, hid, &one, W2, out, h.as<float>(), hid, &zero,
                         y.as<float>(), out));
        BLAS(cublasSger(blas, out, n, &one, b2, 1, ones, 1, y.as<float>(), out));
        BLAS(cublasSaxpy(blas, out * n, &minus_one, dt + col * out, 1, y.as<float>(), 1));
        BLAS(cublasSscal(blas, out * n, &scale, y.as<float>(), 1));
        if (cfg.stall && step == 0 && m + 1 == cfg.accumulate) GPU(cudaLaunchHostFunc(cs, sleep_200ms, nullptr));
        // Backward, accumulating (+=) into the buckets; each layer marked once enqueued.
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, out, hid, n, &one, y.as<float>(), out, h.as<float>(), hid, &one,
                         dW2, out));
        BLAS(cublasSgemv(blas, CUBLAS_OP_N, out, n, &one, y.as<float>(), out, ones, 1, &one, db2, 1));
        ddp.grad_ready(model[2]);
        ddp.grad_ready(model[3]);
        BLAS(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, hid, n, out, &one, W2, out, y.as<float>(), out, &zero,
                         dh.as<float>(), hid));
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, hid, in, n, &one, dh.as<float>(), hid, x, in, &one, dW1, hid));
        BLAS(cublasSgemv(blas, CUBLAS_OP_N, hid, n, &one, dh.as<float>(), hid, ones, 1, &one, db1, 1));
        ddp.grad_ready(model[0]);
        ddp.grad_ready(model[1]);
      }
      const auto t0 = std::chrono::steady_clock::now();
      OR_DIE(ddp.synchronize());
      const double sync_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (cfg.stall && step == 0 && size > 1) {
        bool ok;
        if (emulated) {
          ok = true;  // emulated_cudart.cpp: no timing checks (the stall ran at once, or on a shared CI machine)
        } else if (cfg.host_wait) {
          ok = cudaStreamQuery(ad.comm_stream()) == cudaSuccess && sync_s >= 0.15;
        } else {
          ok = sync_s < 0.1 && cudaStreamQuery(cs) == cudaErrorNotReady;
        }
        r.failed += !ok;
        std::printf("RESULT dpgpu %s_%d_ranks %s %s (rank %d: synchronize() took %.1f ms%s)\n", cfg.name, size,
                    cfg.host_wait ? "host_wait_waits" : "stream_ordered_returns_early", ok ? "ok" : "FAIL", rank,
                    sync_s * 1e3, emulated ? "; not checked: emulated runtime" : "");
      }
      // SGD on the flat buffers, ordered after the averaged gradients on the stream.
      BLAS(cublasSaxpy(blas, static_cast<int>(total), &minus_lr, ddp.flat_grad(), 1, ddp.flat_values(), 1));
      ddp.zero_grad();
    }
    OR_DIE(ad.synchronize());
    r.final.resize(total);
    OR_DIE(ad.copy(r.final.data(), ddp.flat_values(), total));
  }
  OR_DIE(ad.synchronize());
  BLAS(cublasDestroy(blas));
  return r;
}

int run_rank(const char* dir, int rank, int size) {
  auto kv = file_store::open(dir);
  OR_DIE(kv.ok() ? status() : kv.error());
  auto comm = default_communicator::create(*kv.value(), rank, size);
  OR_DIE(comm.ok() ? status() : comm.error());
  // The 1-process reference: each rank alone (a size-1 split), the whole batch.
  auto solo = comm.value()->split(rank, 0);
  OR_DIE(solo.ok() ? status() : solo.error());
  cuda::device_options o;
  o.backend = "native";
  o.chunk_bytes = 4096;  // the 4.2 KiB bucket takes two chunks
  auto made = device_comm::create(*comm.value(), o);
  OR_DIE(made.ok() ? status() : made.error());
  auto made_solo = device_comm::create(*solo.value(), o);
  OR_DIE(made_solo.ok() ? status() : made_solo.error());

  static const dataset data;
  auto dev = [&](const std::vector<float>& v) {
    auto b = cuda::device_buffer::allocate(v.size() * sizeof(float));
    OR_DIE(b.ok() ? status() : b.error());
    GPU(cudaMemcpy(b.value().data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return std::move(b.value());
  };
  const cuda::device_buffer dx = dev(data.x), dt = dev(data.t), ones = dev(std::vector<float>(global, 1.0f));
  GPU(cudaDeviceSynchronize());

  int failed = 0;
  const run_out ref = train_run(*made_solo.value(), {"reference"}, dx.as<float>(), dt.as<float>(), ones.as<float>());
  failed += ref.failed;
  double moved = 0;
  for (std::size_t i = 0; i < ref.final.size(); ++i) moved = std::max(moved, double(std::fabs(ref.final[i] - ref.init[i])));

  const run_cfg cfgs[] = {{"stream_ordered", false, 1, true}, {"host_wait_accumulate2", true, 2, true}};
  for (const run_cfg& cfg : cfgs) {
    run_out r = train_run(*made.value(), cfg, dx.as<float>(), dt.as<float>(), ones.as<float>());
    failed += r.failed;
    std::vector<float> r0 = r.final;
    OR_DIE(comm.value()->broadcast(r0.data(), r0.size(), 0));
    const bool same = std::memcmp(r0.data(), r.final.data(), r0.size() * sizeof(float)) == 0;
    double diff = 0;
    for (std::size_t i = 0; i < r.final.size(); ++i) diff = std::max(diff, double(std::fabs(r.final[i] - ref.final[i])));
    const bool ok = same && r.init == ref.init && diff < 1e-4 && moved > 1e-2;
    failed += !ok;
    if (rank == 0 || !ok)
      std::printf("RESULT dpgpu %s_%d_ranks trained %s (rank %d: ranks bitwise equal: %s, max |2 ranks - 1 rank| "
                  "%.2e, moved %.2e from init, %d steps)\n",
                  cfg.name, size, ok ? "ok" : "FAIL", rank, same ? "yes" : "NO", diff, moved, steps);
  }
  OR_DIE(comm.value()->barrier());
  return failed;
}

}  // namespace

int main() {
  if (!gpu_test::have_device_or_skip("data_parallel_gpu")) return 77;
  const int size = 2;
  const int bad = gpu_test::in_processes("dpgpu", size, [&](const char* dir, int rank) { return run_rank(dir, rank, size); });
  std::printf("RESULT dpgpu check_ranks %d %s\n", size, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
