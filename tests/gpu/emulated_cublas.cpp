// tests/gpu/emulated_cublas.cpp - the handful of cuBLAS calls data_parallel_gpu.cpp
// makes, on the host (column-major, as cuBLAS), for data_parallel_emulated: with
// emulated_cudart.cpp, the trainer's device path runs on a machine without a GPU.
// Straight loops in float: correct, not fast; the results need not match a GPU's
// bits (the test compares ranks with each other and with a 1-process run made
// the same way).
#include <cublas_v2.h>

namespace {
struct handle_st {
  int unused = 0;
};
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
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float acc = 0;
      for (int p = 0; p < k; ++p) acc += at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
      float& c = C[i + static_cast<long>(j) * ldc];
      c = *alpha * acc + (*beta == 0 ? 0.0f : *beta * c);
    }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemv_v2(cublasHandle_t, cublasOperation_t t, int m, int n, const float* alpha, const float* A,
                              int lda, const float* x, int incx, const float* beta, float* y, int incy) {
  const int rows = t == CUBLAS_OP_N ? m : n, cols = t == CUBLAS_OP_N ? n : m;
  for (int i = 0; i < rows; ++i) {
    float acc = 0;
    for (int j = 0; j < cols; ++j) acc += at(A, lda, t, i, j) * x[static_cast<long>(j) * incx];
    float& yi = y[static_cast<long>(i) * incy];
    yi = *alpha * acc + (*beta == 0 ? 0.0f : *beta * yi);
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSger_v2(cublasHandle_t, int m, int n, const float* alpha, const float* x, int incx, const float* y,
                             int incy, float* A, int lda) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i)
      A[i + static_cast<long>(j) * lda] += *alpha * x[static_cast<long>(i) * incx] * y[static_cast<long>(j) * incy];
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSaxpy_v2(cublasHandle_t, int n, const float* alpha, const float* x, int incx, float* y, int incy) {
  for (int i = 0; i < n; ++i) y[static_cast<long>(i) * incy] += *alpha * x[static_cast<long>(i) * incx];
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSscal_v2(cublasHandle_t, int n, const float* alpha, float* x, int incx) {
  for (int i = 0; i < n; ++i) x[static_cast<long>(i) * incx] *= *alpha;
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
