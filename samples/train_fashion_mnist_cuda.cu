// train_fashion_mnist_cuda: data-parallel training of an MLP on Fashion-MNIST, on GPUs.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/train_fashion_mnist_cuda --epochs 5
//   CCLITE_GPU_BACKEND=nccl build/bin/cclite-run --nproc-per-node 8 build/bin/train_fashion_mnist_cuda
//
// The GPU twin of train_fashion_mnist.cpp: the same MLP (784-256-128-10 by
// default), the same SGD with momentum and cosine schedule, the same sharding
// (each rank takes every world-th sample of one shuffled order per epoch) and a
// *global* --batch split over the ranks. Everything lives on the device:
// the dataset (uploaded once as bytes), activations, parameters, gradients and
// momentum; cuBLAS does the matrix products, a few kernels the rest.
//
// Gradients are averaged by train::data_parallel on device memory
// (cclite/cuda/device_data_parallel.hpp): it broadcasts rank 0's initial
// parameters on the device and keeps parameters and gradients in two flat
// device buffers in reverse layer order (the order backward produces them), one
// bucket per layer. As soon as backward has enqueued a layer's gradient kernels
// it marks the layer ready, and the bucket's allreduce(avg) is enqueued on the
// adapter's communication stream after them (cclite::cuda::device_communicator,
// stream-ordered: the call returns at once), so it runs while the lower layers'
// backward is still computing; the optimiser step (one kernel over the flat
// buffers) waits for the communication stream, not the host. The engine is
// CCLITE_GPU_BACKEND: nccl (one rank per GPU) or native (pinned host staging
// over shm/tcp: any number of ranks per GPU); auto picks.
//
// Two compilers, one file: nvcc compiles the kernels (the __CUDACC__ part),
// the host compiler the rest (cclite's communicator, cuBLAS calls, main), as
// samples/CMakeLists.txt does by also compiling a one-line .cpp that includes
// this file. The parts meet through the few launch functions declared below.
//
// No GPU: exits 1 at once with "no CUDA device" and the runtime's reason.
// Rank 0 prints one line per epoch (train loss, test loss and accuracy).
// Data: /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist) or --data DIR.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

// The kernels, launched on `stream` (defined by nvcc below, called from main).
namespace gpu {
void set_pixel_norm(const float* table256);
void gather(const std::uint8_t* pixels, const std::uint8_t* labels, const int* idx, int n, int features, float* x,
            int* y, cudaStream_t stream);
void bias_act(float* y, const float* b, int n, int out, bool relu, cudaStream_t stream);
void softmax_xent(const float* logits, const int* y, int n, int k, float* dlogits, float scale, double* loss_sum,
                  unsigned int* correct, cudaStream_t stream);
void bias_grad(const float* dy, int n, int out, float* db, cudaStream_t stream);
void relu_grad(float* da, const float* a, int total, cudaStream_t stream);
void sgd(float* w, float* v, const float* g, std::size_t n, float lr, float mu, cudaStream_t stream);
}  // namespace gpu

#if defined(__CUDACC__)
// ================================ device part (nvcc) ================================
#include <algorithm>

namespace {

__constant__ float c_norm[256];  // pixel byte -> normalised value (dataset mean / std)

// x[j][f] = norm(pixel f of image idx[j]); y[j] = its label.
__global__ void gather_kernel(const std::uint8_t* __restrict__ pixels, const std::uint8_t* __restrict__ labels,
                              const int* __restrict__ idx, int n, int features, float* __restrict__ x,
                              int* __restrict__ y) {
  const std::size_t total = static_cast<std::size_t>(n) * static_cast<std::size_t>(features);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t j = i / static_cast<std::size_t>(features), f = i % static_cast<std::size_t>(features);
    const std::size_t img = static_cast<std::size_t>(idx[j]);
    x[i] = c_norm[pixels[img * static_cast<std::size_t>(features) + f]];
    if (f == 0) y[j] = labels[img];
  }
}

// y[j][o] = act(y[j][o] + b[o]).
__global__ void bias_act_kernel(float* __restrict__ y, const float* __restrict__ b, int n, int out, bool relu) {
  const int total = n * out;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const float v = y[i] + b[i % out];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// Softmax cross-entropy per sample: loss and hits summed into *loss_sum and
// *correct; when dlogits is set, dlogits = (softmax - onehot) * scale.
__global__ void softmax_xent_kernel(const float* __restrict__ logits, const int* __restrict__ y, int n, int k,
                                    float* __restrict__ dlogits, float scale, double* loss_sum,
                                    unsigned int* correct) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* z = logits + static_cast<std::size_t>(i) * k;
  float m = z[0];
  int arg = 0;
  for (int j = 1; j < k; ++j)
    if (z[j] > m) m = z[j], arg = j;
  float s = 0.0f;
  for (int j = 0; j < k; ++j) s += expf(z[j] - m);
  const int label = y[i];
  atomicAdd(loss_sum, static_cast<double>(m + logf(s) - z[label]));
  if (arg == label) atomicAdd(correct, 1u);
  if (dlogits) {
    float* d = dlogits + static_cast<std::size_t>(i) * k;
    for (int j = 0; j < k; ++j) d[j] = (expf(z[j] - m) / s - (j == label ? 1.0f : 0.0f)) * scale;
  }
}

// db[o] = sum over the batch of dy[j][o].
__global__ void bias_grad_kernel(const float* __restrict__ dy, int n, int out, float* __restrict__ db) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= out) return;
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s += dy[static_cast<std::size_t>(j) * out + o];
  db[o] = s;
}

// ReLU backward: da *= (a > 0), a being the layer's output.
__global__ void relu_grad_kernel(float* __restrict__ da, const float* __restrict__ a, int total) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
    if (a[i] <= 0.0f) da[i] = 0.0f;
}

// torch.optim.SGD with momentum (no dampening, no weight decay): v = mu v + g; w -= lr v.
__global__ void sgd_kernel(float* __restrict__ w, float* __restrict__ v, const float* __restrict__ g, std::size_t n,
                           float lr, float mu) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float m = mu * v[i] + g[i];
    v[i] = m;
    w[i] -= lr * m;
  }
}

int blocks_for(std::size_t n, int threads = 256) {
  return static_cast<int>(std::min<std::size_t>((n + threads - 1) / threads, 4096));
}

}  // namespace

namespace gpu {
void set_pixel_norm(const float* table256) { (void)cudaMemcpyToSymbol(c_norm, table256, 256 * sizeof(float)); }
void gather(const std::uint8_t* pixels, const std::uint8_t* labels, const int* idx, int n, int features, float* x,
            int* y, cudaStream_t stream) {
  gather_kernel<<<blocks_for(static_cast<std::size_t>(n) * features), 256, 0, stream>>>(pixels, labels, idx, n, features,
                                                                                         x, y);
}
void bias_act(float* y, const float* b, int n, int out, bool relu, cudaStream_t stream) {
  bias_act_kernel<<<blocks_for(static_cast<std::size_t>(n) * out), 256, 0, stream>>>(y, b, n, out, relu);
}
void softmax_xent(const float* logits, const int* y, int n, int k, float* dlogits, float scale, double* loss_sum,
                  unsigned int* correct, cudaStream_t stream) {
  softmax_xent_kernel<<<(n + 127) / 128, 128, 0, stream>>>(logits, y, n, k, dlogits, scale, loss_sum, correct);
}
void bias_grad(const float* dy, int n, int out, float* db, cudaStream_t stream) {
  bias_grad_kernel<<<(out + 127) / 128, 128, 0, stream>>>(dy, n, out, db);
}
void relu_grad(float* da, const float* a, int total, cudaStream_t stream) {
  relu_grad_kernel<<<blocks_for(static_cast<std::size_t>(total)), 256, 0, stream>>>(da, a, total);
}
void sgd(float* w, float* v, const float* g, std::size_t n, float lr, float mu, cudaStream_t stream) {
  sgd_kernel<<<blocks_for(n), 256, 0, stream>>>(w, v, g, n, lr, mu);
}
}  // namespace gpu

#else
// ============================ host part (the C++ compiler) ============================
#include <cclite/cclite.hpp>
#include <cclite/cuda/device_communicator.hpp>
#include <cclite/cuda/device_data_parallel.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/train/parameter.hpp>

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"

using comm_t = cclite::default_communicator;
using device_comm = cclite::cuda::device_communicator<comm_t>;
using adapter = cclite::cuda::device_comm_adapter<comm_t>;

namespace {

struct args {
  int epochs = 5;
  int batch = 64;  // global
  float lr = 0.05f;
  float momentum = 0.9f;
  std::string schedule = "cosine";
  std::vector<int> hidden = {256, 128};
  std::string data = sample::default_fashion_mnist_dir();
  std::uint64_t seed = 42;
  long max_steps = 0;
  bool device_check = false;
};

void usage() {
  std::printf(
      "usage: train_fashion_mnist_cuda [options]\n"
      "  --epochs E            epochs to train (default 5)\n"
      "  --batch B             global batch, split evenly over the ranks (default 64)\n"
      "  --lr X                SGD learning rate (default 0.05)\n"
      "  --momentum X          SGD momentum (default 0.9)\n"
      "  --schedule cosine|constant  (default cosine)\n"
      "  --hidden 256,128      hidden layer widths\n"
      "  --data DIR            dataset directory (default %s)\n"
      "  --seed S              shuffling and initialisation seed (default 42)\n"
      "  --max-steps N         stop each epoch after N steps (quick runs)\n"
      "  --device-check        print this process's CUDA device (or why there is none) and exit\n"
      "Environment: CCLITE_GPU_BACKEND=nccl|native|auto, CCLITE_TIMEOUT, CCLITE_DEBUG\n",
      sample::default_fashion_mnist_dir());
}

bool parse(int argc, char** argv, args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--epochs") a.epochs = std::atoi(val());
    else if (k == "--batch") a.batch = std::atoi(val());
    else if (k == "--lr") a.lr = std::strtof(val(), nullptr);
    else if (k == "--momentum") a.momentum = std::strtof(val(), nullptr);
    else if (k == "--schedule") a.schedule = val();
    else if (k == "--data") a.data = val();
    else if (k == "--seed") a.seed = std::strtoull(val(), nullptr, 10);
    else if (k == "--max-steps") a.max_steps = std::atol(val());
    else if (k == "--device-check") a.device_check = true;
    else if (k == "--hidden") {
      a.hidden.clear();
      for (const char* p = val(); *p;) {
        char* end;
        long v = std::strtol(p, &end, 10);
        if (end == p || v <= 0) return false;
        a.hidden.push_back(static_cast<int>(v));
        if (*end && *end != ',') return false;
        p = *end == ',' ? end + 1 : end;
      }
    } else if (k == "-h" || k == "--help") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown option %s (see --help)\n", k.c_str());
      return false;
    }
  }
  return a.epochs >= 0 && a.batch > 0 && (a.schedule == "cosine" || a.schedule == "constant");
}

int fail(int rank, const cclite::status& st) {
  std::fprintf(stderr, "train_fashion_mnist_cuda rank %d: %s\n", rank, st.to_string().c_str());
  return 1;
}

cclite::status cuda_ok(cudaError_t e, const char* what) { return cclite::cuda::cuda_status(e, what); }

cclite::status cublas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return cclite::make_error(cclite::errc::system_error, "%s: %s", what, cublasGetStatusString(s));
}

#define TRY_OR_FAIL(expr)                                  \
  do {                                                     \
    ::cclite::status st_ = (expr);                         \
    if (!st_.ok()) return fail(rank, st_);                 \
  } while (0)

// Device memory for `count` values of T, freed by the destructor.
template <class T>
struct dev_array {
  cclite::cuda::device_buffer buf;
  cclite::status alloc(std::size_t count) {
    auto b = cclite::cuda::device_buffer::allocate(count * sizeof(T));
    if (!b) return b.error();
    buf = std::move(b.value());
    return {};
  }
  T* get() const { return buf.as<T>(); }
};

struct layer {
  int in = 0, out = 0;
  float *w = nullptr, *b = nullptr;    // values, in data_parallel's flat device buffer
  float *dw = nullptr, *db = nullptr;  // gradients, likewise
};

}  // namespace

int main(int argc, char** argv) {
  args a;
  if (!parse(argc, argv, a)) {
    usage();
    return 2;
  }
  int rank = -1;
  // First of all: is there a GPU? A clear answer, not a crash, on machines without one.
  if (auto n = cclite::cuda::device_count(); !n) {
    std::fprintf(stderr, "train_fashion_mnist_cuda: %s\n", n.error().to_string().c_str());
    return 1;
  } else if (a.device_check) {
    cudaDeviceProp p{};
    TRY_OR_FAIL(cuda_ok(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties"));
    std::printf("train_fashion_mnist_cuda: %d CUDA device(s), device 0: %s (sm_%d%d)\n", n.value(), p.name, p.major,
                p.minor);
    return 0;
  }
  const char* launcher_vars[] = {"CCLITE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  if (std::none_of(std::begin(launcher_vars), std::end(launcher_vars),
                   [](const char* v) { return std::getenv(v) != nullptr; })) {
    ::setenv("CCLITE_RANK", "0", 1);
    ::setenv("CCLITE_WORLD_SIZE", "1", 1);
  }
  auto env = cclite::init();
  if (!env) return fail(rank, env.error());
  comm_t& comm = *env.value();
  rank = comm.rank();
  const int world = comm.size();
  if (a.batch % world != 0) {
    if (rank == 0) std::fprintf(stderr, "--batch %d must be a multiple of the rank count %d\n", a.batch, world);
    return 2;
  }
  const int local_batch = a.batch / world;

  auto made = device_comm::create(comm);
  if (!made) return fail(rank, made.error());
  device_comm& dc = *made.value();

  auto loaded = sample::load_fashion_mnist(a.data);
  if (!loaded) return fail(rank, loaded.error());
  const sample::fashion_mnist& ds = loaded.value();
  const int features = ds.train.features();
  const int classes = 10;

  // ---- model: fc1.weight, fc1.bias, fc2.weight, ... (data_parallel's registration order)
  std::vector<int> sizes = {features};
  sizes.insert(sizes.end(), a.hidden.begin(), a.hidden.end());
  sizes.push_back(classes);
  const int L = static_cast<int>(sizes.size()) - 1;
  std::vector<layer> layers(static_cast<std::size_t>(L));
  std::vector<cclite::train::parameter> model;  // names, sizes and initial values (host)
  model.reserve(2 * static_cast<std::size_t>(L));
  // PyTorch's nn.Linear initialisation, U(-1/sqrt(in), 1/sqrt(in)); data_parallel
  // replaces every rank's values with rank 0's.
  std::mt19937_64 init(a.seed);
  for (int l = 0; l < L; ++l) {
    layer& ly = layers[static_cast<std::size_t>(l)];
    ly.in = sizes[static_cast<std::size_t>(l)];
    ly.out = sizes[static_cast<std::size_t>(l) + 1];
    const std::string name = "fc" + std::to_string(l + 1);
    model.emplace_back(name + ".weight", static_cast<std::size_t>(ly.in) * static_cast<std::size_t>(ly.out));
    model.emplace_back(name + ".bias", static_cast<std::size_t>(ly.out));
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(static_cast<float>(ly.in)),
                                            1.0f / std::sqrt(static_cast<float>(ly.in)));
    for (float& v : model[model.size() - 2].values()) v = u(init);
    for (float& v : model.back().values()) v = u(init);
  }
  cclite::train::parameter_list plist;
  for (auto& p : model) plist.push_back(&p);

  auto compute_s = cclite::cuda::stream::create();
  if (!compute_s) return fail(rank, compute_s.error());
  cudaStream_t cs = compute_s.value().get();
  auto made_ad = adapter::create(dc, cs);
  if (!made_ad) return fail(rank, made_ad.error());
  adapter& ad = *made_ad.value();
  // One bucket per layer (caps of 1 byte: a layer's weight and bias are never
  // split), so the last layers' buckets are reduced while backward goes on.
  cclite::train::dp_options dpo;
  dpo.first_bucket_cap_bytes = 1;
  dpo.bucket_cap_bytes = 1;
  auto made_dp = cclite::cuda::device_data_parallel<comm_t>::create(ad, plist, dpo);
  if (!made_dp) return fail(rank, made_dp.error());
  auto& ddp = made_dp.value();
  const std::size_t total = ddp.flat_size();
  for (int l = 0; l < L; ++l) {
    layer& ly = layers[static_cast<std::size_t>(l)];
    const auto& w = model[2 * static_cast<std::size_t>(l)];
    const auto& b = model[2 * static_cast<std::size_t>(l) + 1];
    ly.w = ddp.value(w), ly.b = ddp.value(b), ly.dw = ddp.grad(w), ly.db = ddp.grad(b);
  }

  const int max_rows = std::max(local_batch, 1000);  // training micro-batch or evaluation chunk
  const int widest = *std::max_element(sizes.begin(), sizes.end());
  dev_array<float> momentum, dbuf0, dbuf1;
  std::vector<dev_array<float>> acts(static_cast<std::size_t>(L) + 1);  // acts[0] = x, acts[l+1] = layer l's output
  dev_array<std::uint8_t> train_px, train_lb, test_px, test_lb;
  dev_array<int> idx, labels;
  dev_array<double> loss_sum;
  dev_array<unsigned int> correct;
  TRY_OR_FAIL(momentum.alloc(total));
  TRY_OR_FAIL(dbuf0.alloc(static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(widest)));
  TRY_OR_FAIL(dbuf1.alloc(static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(widest)));
  for (int l = 0; l <= L; ++l)
    TRY_OR_FAIL(acts[static_cast<std::size_t>(l)].alloc(static_cast<std::size_t>(max_rows) *
                                                        static_cast<std::size_t>(sizes[static_cast<std::size_t>(l)])));
  TRY_OR_FAIL(train_px.alloc(ds.train.pixels.size()));
  TRY_OR_FAIL(train_lb.alloc(ds.train.labels.size()));
  TRY_OR_FAIL(test_px.alloc(ds.test.pixels.size()));
  TRY_OR_FAIL(test_lb.alloc(ds.test.labels.size()));
  TRY_OR_FAIL(idx.alloc(std::max<std::size_t>(static_cast<std::size_t>(ds.train.count), static_cast<std::size_t>(ds.test.count))));
  TRY_OR_FAIL(labels.alloc(static_cast<std::size_t>(max_rows)));
  TRY_OR_FAIL(loss_sum.alloc(2));
  TRY_OR_FAIL(correct.alloc(2));
  TRY_OR_FAIL(cuda_ok(cudaMemsetAsync(momentum.get(), 0, total * sizeof(float), cs), "cudaMemsetAsync"));
  TRY_OR_FAIL(cuda_ok(cudaMemcpy(train_px.get(), ds.train.pixels.data(), ds.train.pixels.size(), cudaMemcpyHostToDevice), "upload dataset"));
  TRY_OR_FAIL(cuda_ok(cudaMemcpy(train_lb.get(), ds.train.labels.data(), ds.train.labels.size(), cudaMemcpyHostToDevice), "upload dataset"));
  TRY_OR_FAIL(cuda_ok(cudaMemcpy(test_px.get(), ds.test.pixels.data(), ds.test.pixels.size(), cudaMemcpyHostToDevice), "upload dataset"));
  TRY_OR_FAIL(cuda_ok(cudaMemcpy(test_lb.get(), ds.test.labels.data(), ds.test.labels.size(), cudaMemcpyHostToDevice), "upload dataset"));
  float norm[256];
  for (int v = 0; v < 256; ++v) norm[v] = (v / 255.0f - 0.2860f) / 0.3530f;
  gpu::set_pixel_norm(norm);

  cublasHandle_t blas = nullptr;
  TRY_OR_FAIL(cublas_ok(cublasCreate(&blas), "cublasCreate"));
  TRY_OR_FAIL(cublas_ok(cublasSetStream(blas, cs), "cublasSetStream"));

  if (rank == 0) {
    std::printf("train_fashion_mnist_cuda: %d rank%s on %s engine, MLP", world, world == 1 ? "" : "s",
                cclite::cuda::to_string(dc.engine()));
    for (std::size_t i = 0; i < sizes.size(); ++i) std::printf("%s%d", i ? "-" : " ", sizes[i]);
    std::printf(" (%zu parameters), global batch %d (%d per rank), sgd lr %g momentum %g (%s), %d gradient buckets\n",
                total, a.batch, local_batch, static_cast<double>(a.lr), static_cast<double>(a.momentum),
                a.schedule.c_str(), static_cast<int>(ddp.buckets().buckets.size()));
    std::fflush(stdout);
  }

  const float one = 1.0f, zero = 0.0f;
  // logits = forward(x) for n rows already in acts[0]; returns the logits buffer.
  auto forward = [&](int n) -> cclite::status {
    for (int l = 0; l < L; ++l) {
      const layer& ly = layers[static_cast<std::size_t>(l)];
      // Row-major Y[n x out] = X[n x in] W^T, i.e. column-major Y^T = W(out x in) X^T:
      // W's row-major buffer read as column-major is W^T (ld in), hence OP_T.
      CCLITE_TRY(cublas_ok(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, ly.out, n, ly.in, &one, ly.w, ly.in,
                                       acts[static_cast<std::size_t>(l)].get(), ly.in, &zero,
                                       acts[static_cast<std::size_t>(l) + 1].get(), ly.out),
                           "cublasSgemm (forward)"));
      gpu::bias_act(acts[static_cast<std::size_t>(l) + 1].get(), ly.b, n, ly.out, l + 1 < L, cs);
    }
    return cuda_ok(cudaGetLastError(), "forward kernels");
  };

  // Backward from dlogits (in dbuf0) for n rows; each layer's gradient bucket
  // is allreduced on the communication stream as soon as it is enqueued, and
  // synchronize() orders the compute stream (the optimiser) after all of them.
  auto backward = [&](int n) -> cclite::status {
    float* dy = dbuf0.get();
    float* dx = dbuf1.get();
    for (int l = L - 1; l >= 0; --l) {
      const layer& ly = layers[static_cast<std::size_t>(l)];
      const float* x = acts[static_cast<std::size_t>(l)].get();
      // dW[out x in] = dY^T X: column-major dW^T(in x out) = X^T(in x n) dY(n x out).
      CCLITE_TRY(cublas_ok(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, ly.in, ly.out, n, &one, x, ly.in, dy, ly.out,
                                       &zero, ly.dw, ly.in),
                           "cublasSgemm (weight gradient)"));
      gpu::bias_grad(dy, n, ly.out, ly.db, cs);
      CCLITE_TRY(cuda_ok(cudaGetLastError(), "bias_grad_kernel"));
      // This layer's gradients are enqueued (overwritten, so no zero_grad): its
      // bucket goes to the communication stream after them.
      ddp.grad_ready(model[2 * static_cast<std::size_t>(l)]);
      ddp.grad_ready(model[2 * static_cast<std::size_t>(l) + 1]);
      if (l == 0) break;
      // dX[n x in] = dY W: column-major dX^T(in x n) = W^T(in x out) dY^T(out x n).
      CCLITE_TRY(cublas_ok(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, ly.in, n, ly.out, &one, ly.w, ly.in,
                                       dy, ly.out, &zero, dx, ly.in),
                           "cublasSgemm (input gradient)"));
      gpu::relu_grad(dx, x, n * ly.in, cs);
      CCLITE_TRY(cuda_ok(cudaGetLastError(), "relu_grad_kernel"));
      std::swap(dy, dx);
    }
    // The last bucket, then the optimiser step waits for the averaged gradients, on the GPU.
    return ddp.synchronize();
  };

  // Sums over all ranks of {loss, count, correct} with host pointers: the
  // device communicator sees host memory and takes the CPU path.
  auto reduce_sums = [&](double* v, int n) { return dc.allreduce(v, v, static_cast<std::size_t>(n), cclite::dtype::float64, cclite::reduce_op::sum); };

  const std::size_t train_n = static_cast<std::size_t>(ds.train.count);
  // Every rank takes ceil(train_n / world) samples (wrapping around, as
  // distributed_sampler pads), so all ranks make the same number of steps.
  const std::size_t per_rank = (train_n + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world);
  const long steps_full = static_cast<long>((per_rank + static_cast<std::size_t>(local_batch) - 1) / static_cast<std::size_t>(local_batch));
  const long steps = a.max_steps > 0 ? std::min(a.max_steps, steps_full) : steps_full;
  const long total_steps = steps * a.epochs;
  std::vector<int> order(train_n), mine(per_rank);
  double last_accuracy = -1;
  const auto job_start = std::chrono::steady_clock::now();

  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 shuffle(a.seed * 1000003u + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle);
    for (std::size_t i = 0; i < per_rank; ++i) mine[i] = order[(i * static_cast<std::size_t>(world) + static_cast<std::size_t>(rank)) % train_n];
    TRY_OR_FAIL(cuda_ok(cudaMemcpyAsync(idx.get(), mine.data(), per_rank * sizeof(int), cudaMemcpyHostToDevice, cs), "upload indices"));
    TRY_OR_FAIL(cuda_ok(cudaMemsetAsync(loss_sum.get(), 0, 2 * sizeof(double), cs), "cudaMemsetAsync"));
    TRY_OR_FAIL(cuda_ok(cudaMemsetAsync(correct.get(), 0, 2 * sizeof(unsigned int), cs), "cudaMemsetAsync"));
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t seen = 0;
    for (long step = 0; step < steps; ++step) {
      float lr = a.lr;
      if (a.schedule == "cosine") {
        const double progress = static_cast<double>(epoch * steps + step) / static_cast<double>(total_steps);
        lr = static_cast<float>(a.lr * 0.5 * (1.0 + std::cos(M_PI * progress)));
      }
      const std::size_t begin = static_cast<std::size_t>(step) * static_cast<std::size_t>(local_batch);
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(local_batch), per_rank - begin));
      gpu::gather(train_px.get(), train_lb.get(), idx.get() + begin, n, features, acts[0].get(), labels.get(), cs);
      TRY_OR_FAIL(forward(n));
      gpu::softmax_xent(acts[static_cast<std::size_t>(L)].get(), labels.get(), n, classes, dbuf0.get(),
                        1.0f / static_cast<float>(n), loss_sum.get(), correct.get(), cs);
      TRY_OR_FAIL(backward(n));
      gpu::sgd(ddp.flat_values(), momentum.get(), ddp.flat_grad(), total, lr, a.momentum, cs);
      TRY_OR_FAIL(cuda_ok(cudaGetLastError(), "training kernels"));
      seen += static_cast<std::size_t>(n);
    }
    TRY_OR_FAIL(ad.synchronize());  // bounded; reports a failed collective
    const double epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // ---- evaluation: each rank one shard of the test set -----------------------------
    std::vector<int> test_idx;
    for (int i = rank; i < ds.test.count; i += world) test_idx.push_back(i);
    TRY_OR_FAIL(cuda_ok(cudaMemcpyAsync(idx.get(), test_idx.data(), test_idx.size() * sizeof(int), cudaMemcpyHostToDevice, cs), "upload indices"));
    for (std::size_t b = 0; b < test_idx.size(); b += static_cast<std::size_t>(max_rows)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(max_rows), test_idx.size() - b));
      gpu::gather(test_px.get(), test_lb.get(), idx.get() + b, n, features, acts[0].get(), labels.get(), cs);
      TRY_OR_FAIL(forward(n));
      gpu::softmax_xent(acts[static_cast<std::size_t>(L)].get(), labels.get(), n, classes, nullptr, 0.0f,
                        loss_sum.get() + 1, correct.get() + 1, cs);
    }
    double dl[2] = {0, 0};
    unsigned int dcnt[2] = {0, 0};
    TRY_OR_FAIL(cuda_ok(cudaMemcpyAsync(dl, loss_sum.get(), sizeof dl, cudaMemcpyDeviceToHost, cs), "download sums"));
    TRY_OR_FAIL(cuda_ok(cudaMemcpyAsync(dcnt, correct.get(), sizeof dcnt, cudaMemcpyDeviceToHost, cs), "download sums"));
    TRY_OR_FAIL(dc.synchronize(cs));
    double sums[5] = {dl[0], static_cast<double>(seen), dl[1], static_cast<double>(dcnt[1]), static_cast<double>(test_idx.size())};
    TRY_OR_FAIL(reduce_sums(sums, 5));
    last_accuracy = sums[3] / std::max(sums[4], 1.0);
    if (rank == 0) {
      std::printf("epoch %d/%d: %.2f s, %.0f samples/s, train loss %.4f, test loss %.4f, test accuracy %.4f\n", epoch + 1,
                  a.epochs, epoch_s, sums[1] / epoch_s, sums[0] / std::max(sums[1], 1.0), sums[2] / std::max(sums[4], 1.0),
                  last_accuracy);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    std::printf("final test accuracy %.4f after %d epochs (%.1f s)\n", last_accuracy, a.epochs,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count());
  }
  (void)cublasDestroy(blas);
  return 0;
}

#endif  // __CUDACC__
