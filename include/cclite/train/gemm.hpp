// cclite/train/gemm.hpp - the matrix product behind every layer of cclite::train.
//
//   train::gemm(false, true, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out);  // y = x w^T
//
// Row-major single-precision C = alpha * op(A) * op(B) + beta * C, as CBLAS
// sgemm with CblasRowMajor. With CCLITE_HAS_CBLAS (defined by the CMake target
// cclite::train when it found a CBLAS, OpenBLAS preferred; see cmake/blas.cmake)
// the call goes to cblas_sgemm. Without it a portable loop nest does the same
// arithmetic an order of magnitude slower: it exists so that every header still
// compiles and every test still runs on a machine without a BLAS.
//
// Determinism: for given shapes and inputs both paths return the same bits on
// every call in every process with the same library and thread count, which is
// what lets data-parallel ranks stay bitwise identical. They may differ from
// each other (summation order), and between thread counts in some BLAS builds,
// so every rank of a job must use the same backend and thread count.
#pragma once

#include <cstddef>

#if defined(CCLITE_HAS_CBLAS)
#include <cblas.h>
#endif

namespace cclite::train {

/// Name of the matrix-product backend compiled in: "openblas", "cblas" or
/// "portable (slow; install libopenblas-dev)".
inline const char* gemm_backend() noexcept {
#if defined(CCLITE_HAS_OPENBLAS)
  return "openblas";
#elif defined(CCLITE_HAS_CBLAS)
  return "cblas";
#else
  return "portable (slow; install libopenblas-dev)";
#endif
}

/// The kernel set OpenBLAS chose for this CPU when it loaded ("Haswell",
/// "SkylakeX", ...; the environment variable OPENBLAS_CORETYPE overrides the
/// choice, as on the development machines, which pin "Haswell"), or "" with
/// another backend. The sample prints it: a step's speed depends on it.
inline const char* gemm_kernels() noexcept {
#if defined(CCLITE_HAS_OPENBLAS)
  const char* core = openblas_get_corename();
  return core ? core : "";
#else
  return "";
#endif
}

/// Sets how many threads one matrix product may use (OpenBLAS only; other
/// backends read their own environment, e.g. OMP_NUM_THREADS). One per rank is
/// what a data-parallel job with one rank per core wants.
inline void set_compute_threads(int n) noexcept {
#if defined(CCLITE_HAS_OPENBLAS)
  openblas_set_num_threads(n < 1 ? 1 : n);
#else
  (void)n;
#endif
}

namespace detail {

// Portable fallback. Each case picks the loop order that reads memory with
// unit stride in the innermost loop; the sum over k always runs in increasing
// k with a fixed association, so the result does not depend on m or n.
inline void gemm_portable(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                          const float* a, int lda, const float* b, int ldb, float beta, float* c,
                          int ldc) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
    if (beta == 0.0f) {
      for (int j = 0; j < n; ++j) ci[j] = 0.0f;
    } else if (beta != 1.0f) {
      for (int j = 0; j < n; ++j) ci[j] *= beta;
    }
  }
  if (m == 0 || n == 0 || k == 0 || alpha == 0.0f) return;
  auto at = [&](int i, int p) { return trans_a ? a[static_cast<std::ptrdiff_t>(p) * lda + i] : a[static_cast<std::ptrdiff_t>(i) * lda + p]; };
  if (!trans_b) {
    // C[i][:] += alpha * A(i,p) * B[p][:], for p = 0..k-1: unit stride in j.
    for (int i = 0; i < m; ++i) {
      float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
      for (int p = 0; p < k; ++p) {
        const float s = alpha * at(i, p);
        const float* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
        for (int j = 0; j < n; ++j) ci[j] += s * bp[j];
      }
    }
    return;
  }
  // op(B)(p, j) = B[j][p]: a dot product over p per (i, j). Eight partial sums
  // in a fixed order let the compiler keep them in registers without -ffast-math.
  for (int i = 0; i < m; ++i) {
    float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
    for (int j = 0; j < n; ++j) {
      const float* bj = b + static_cast<std::ptrdiff_t>(j) * ldb;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int p = 0;
      if (!trans_a) {
        const float* ai = a + static_cast<std::ptrdiff_t>(i) * lda;
        for (; p + 8 <= k; p += 8)
          for (int u = 0; u < 8; ++u) acc[u] += ai[p + u] * bj[p + u];
      }
      float tail = 0.0f;
      for (; p < k; ++p) tail += at(i, p) * bj[p];
      const float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
      ci[j] += alpha * sum;
    }
  }
}

}  // namespace detail

/// C (m x n, leading dimension ldc) = alpha * op(A) * op(B) + beta * C, row-major,
/// where op(A) is m x k (A is k x m when trans_a) and op(B) is k x n (B is n x k
/// when trans_b). beta == 0 overwrites C (NaNs in C are not propagated).
/// Preconditions: m, n, k >= 0; leading dimensions at least the stored row length.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
#if defined(CCLITE_HAS_CBLAS)
  if (k <= 0) {  // some BLAS builds reject k == 0; the result is beta * C
    detail::gemm_portable(trans_a, trans_b, m, n, 0, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  detail::gemm_portable(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

}  // namespace cclite::train
