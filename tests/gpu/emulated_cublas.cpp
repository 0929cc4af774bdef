// tests/gpu/emulated_cublas.cpp - the handful of cuBLAS calls data_parallel_gpu.cpp
// makes, on the host (column-major, as cuBLAS), for data_parallel_emulated: with
// emulated_cudart.cpp, the trainer's device path runs on a machine without a GPU.
// Straight loops in float: correct, not fast; the results need not match a GPU's
// bits (the test compares ranks with each other and with a 1-process run made
// the same way). Each call runs in order on the handle's stream, through
// cudaLaunchHostFunc: at once in emulated_cudart.cpp's in-order mode, on the
// stream's thread in its asynchronous mode (as a GPU would run it, later).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <utility>

namespace {
struct handle_st {
  cudaStream_t stream = nullptr;
};
// Runs `f` on h's stream. Scalars are read at the call (host pointer mode).
template <class F>
cublasStatus_t on_stream(cublasHandle_t h, F f) {
  auto* job = new std::function<void()>(std::move(f));
  const cudaError_t e = cudaLaunchHostFunc(reinterpret_cast<handle_st*>(h)->stream, [](void* p) {
    auto* j = static_cast<std::function<void()>*>(p);
    (*j)();
    delete j;
  }, job);
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
// op(M)[i][j] of a column-major m x n (after op) matrix with leading dimension ld.
inline float at(const float* M, int ld, cublasOperation_t op, int i, int j) {
  return op == CUBLAS_OP_N ? M[i + static_cast<long>(j) * ld] : M[j + static_cast<long>(i) * ld];
}
}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new handle_st);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete reinterpret_cast<handle_st*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  reinterpret_cast<handle_st*>(h)->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha_p, const float* A, int lda, const float* B, int ldb,
                              const float* beta_p, float* C, int ldc) {
  const float alpha = *alpha_p, beta = *beta_p;
  return on_stream(h, [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int p = 0; p < k; ++p) acc += at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
        float& c = C[i + static_cast<long>(j) * ldc];
        c = alpha * acc + (beta == 0 ? 0.0f : beta * c);
      }
  });
}
cublasStatus_t cublasSgemv_v2(cublasHandle_t h, cublasOperation_t t, int m, int n, const float* alpha_p,
                              const float* A, int lda, const float* x, int incx, const float* beta_p, float* y,
                              int incy) {
  const float alpha = *alpha_p, beta = *beta_p;
  return on_stream(h, [=] {
    const int rows = t == CUBLAS_OP_N ? m : n, cols = t == CUBLAS_OP_N ? n : m;
    for (int i = 0; i < rows; ++i) {
      float acc = 0;
      for (int j = 0; j < cols; ++j) acc += at(A, lda, t, i, j) * x[static_cast<long>(j) * incx];
      float& yi = y[static_cast<long>(i) * incy];
      yi = alpha * acc + (beta == 0 ? 0.0f : beta * yi);
    }
  });
}
cublasStatus_t cublasSger_v2(cublasHandle_t h, int m, int n, const float* alpha_p, const float* x, int incx,
                             const float* y, int incy, float* A, int lda) {
  const float alpha = *alpha_p;
  return on_stream(h, [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i)
        A[i + static_cast<long>(j) * lda] += alpha * x[static_cast<long>(i) * incx] * y[static_cast<long>(j) * incy];
  });
}
cublasStatus_t cublasSaxpy_v2(cublasHandle_t h, int n, const float* alpha_p, const float* x, int incx, float* y,
                              int incy) {
  const float alpha = *alpha_p;
  return on_stream(h, [=] {
    for (int i = 0; i < n; ++i) y[static_cast<long>(i) * incy] += alpha * x[static_cast<long>(i) * incx];
  });
}
cublasStatus_t cublasSscal_v2(cublasHandle_t h, int n, const float* alpha_p, float* x, int incx) {
  const float alpha = *alpha_p;
  return on_stream(h, [=] {
    for (int i = 0; i < n; ++i) x[static_cast<long>(i) * incx] *= alpha;
  });
}

}  // extern "C"
