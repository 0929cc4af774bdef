// cclite/config.hpp - compile-time configuration shared by every header.
//
// Feature macros a user may set before including cclite (or on the command line):
//   CCLITE_NO_EXCEPTIONS  force the no-exceptions code paths (auto-detected from
//                         -fno-exceptions otherwise).
//   CCLITE_NO_THREADS     the communicator never starts a thread: blocking
//                         collectives run on the caller's thread, every *_async
//                         call returns errc::unsupported (collective/work_queue.hpp).
//                         Set it the same way in every TU of a program (ODR).
//                         No rank starts a thread, rank 0 included: the TCP
//                         store server of cclite::init() runs its poll loop in
//                         a forked helper process instead (tcp/rendezvous.hpp);
//                         a program that cannot fork hosts a store_server with
//                         no thread itself (store_server::progress()/hook())
//                         or rendezvouses through a file store.
//   CCLITE_SEPARATE_COMPILATION  compile cclite's set-up code once instead of in
//                         every TU (Asio's ASIO_SEPARATE_COMPILATION): define it
//                         for every TU of the program and include <cclite/src.hpp>
//                         in exactly one of them (collective/separate_compilation.hpp).
//
// Macros this header defines for the rest of the library:
//   CCLITE_HAS_EXCEPTIONS 0/1
//   CCLITE_RESTRICT       `__restrict` where the compiler has it: lets the
//                         reduction loops vectorise without runtime alias checks.
//   CCLITE_LIKELY(x) / CCLITE_UNLIKELY(x)
//   CCLITE_NOINLINE       compiled once, not inlined or cloned (below)
//   CCLITE_SETUP_CODE_BEGIN / _END  set-up code compiled for size (below)
//   CCLITE_DECL           the declaration specifier of a non-template function
//                         that CCLITE_SEPARATE_COMPILATION compiles once:
//                         `inline` in the header-only build, nothing otherwise
//   CCLITE_DEFINITIONS    1 where those functions' definitions are compiled:
//                         the header-only build and the TU of <cclite/src.hpp>
#pragma once

#define CCLITE_VERSION_MAJOR 0
#define CCLITE_VERSION_MINOR 1
#define CCLITE_VERSION_PATCH 0

#if defined(CCLITE_NO_EXCEPTIONS)
#define CCLITE_HAS_EXCEPTIONS 0
#elif defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define CCLITE_HAS_EXCEPTIONS 1
#else
#define CCLITE_HAS_EXCEPTIONS 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define CCLITE_RESTRICT __restrict
#define CCLITE_LIKELY(x) __builtin_expect(!!(x), 1)
#define CCLITE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CCLITE_RESTRICT
#define CCLITE_LIKELY(x) (x)
#define CCLITE_UNLIKELY(x) (x)
#endif
// CCLITE_NOINLINE: a function compiled once, neither inlined nor cloned per
// caller (GCC's noclone: no constant-propagated copies), for loops that many
// callers share through a function pointer (primitives::pump).
#if defined(__GNUC__) && !defined(__clang__)
#define CCLITE_NOINLINE __attribute__((noinline, noclone))
#elif defined(__clang__)
#define CCLITE_NOINLINE __attribute__((noinline))
#else
#define CCLITE_NOINLINE
#endif

// Reduction kernels and the float16 conversions they call are compiled
// without -ftrapping-math (GCC): otherwise GCC keeps the float16 rounding
// cases as branches and does not vectorise the float16 loops. cclite never
// relies on floating-point exceptions. Both BEGIN and END must enclose whole
// function definitions so that callers and callees share the options (GCC
// does not inline across different optimize settings).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)  // nvcc warns on the pragmas
#define CCLITE_FP_KERNELS_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"no-trapping-math\")")
#define CCLITE_FP_KERNELS_END _Pragma("GCC pop_options")
#else
#define CCLITE_FP_KERNELS_BEGIN
#define CCLITE_FP_KERNELS_END
#endif

// Set-up code (stores, rendezvous, launcher detection: run once per job) is
// compiled for size: it is most of the code a program gets from cclite and of
// the compile time of a TU that calls init(), and never runs inside a
// collective. GCC only, and only when optimising (a -O0 build stays
// debuggable); CCLITE_SETUP_FOR_SPEED keeps the command line's level. BEGIN
// and END enclose whole function definitions and never a std header. GCC
// still inlines a small size-optimised function into a speed-optimised caller.
// The regions also turn off -fipa-modref: a function that stops being inlined
// exposes its callers to GCC 12's mod/ref miscompile (CMakeLists.txt, where
// every cclite target turns it off for the whole program).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__) && \
    !defined(CCLITE_SETUP_FOR_SPEED)
#define CCLITE_SETUP_CODE_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"Os\", \"no-ipa-modref\")")
#define CCLITE_SETUP_CODE_END _Pragma("GCC pop_options")
#else
#define CCLITE_SETUP_CODE_BEGIN
#define CCLITE_SETUP_CODE_END
#endif

// Separate compilation (collective/separate_compilation.hpp): a function marked
// CCLITE_DECL is declared by its header everywhere and defined only where
// CCLITE_DEFINITIONS is 1, so a TU of a separately compiled program does not
// compile it; <cclite/src.hpp> defines CCLITE_SOURCE before anything else.
#if defined(CCLITE_SEPARATE_COMPILATION)
#define CCLITE_DECL
#if defined(CCLITE_SOURCE)
#define CCLITE_DEFINITIONS 1
#else
#define CCLITE_DEFINITIONS 0
#endif
#else
#define CCLITE_DECL inline
#define CCLITE_DEFINITIONS 1
#endif

// Byte order and alignment, where the wire depends on them:
//  - Every frame cclite defines (tcp hello, store protocol, call headers) is
//    encoded byte by byte as little-endian, whatever the host.
//  - Collective payloads are not converted: elements travel in host byte order
//    and are reduced where they arrive, so all ranks of a job must share one
//    byte order. cclite supports little-endian hosts only (x86-64, aarch64,
//    32-bit ARM, RISC-V); the check below turns a big-endian build into a
//    compile error instead of silently wrong sums.
//  - User buffers must be aligned to their element type (as for NCCL/MPI): the
//    kernels access them as T*. Link buffers are 4096-byte aligned and streams
//    stay aligned to max_dtype_size (transport/concept.hpp), so a piece handed
//    to a kernel never starts mid-element or misaligned (which 32-bit ARM
//    would punish).
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "cclite sends collective payloads in host byte order and supports little-endian hosts only");
#endif

namespace cclite {
/// Largest element size of any dtype. Link byte streams are kept aligned to it
/// between collectives so that a receiver never sees an element split in two.
inline constexpr unsigned max_dtype_size = 8;
}  // namespace cclite
