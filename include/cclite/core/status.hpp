// cclite/core/status.hpp - errors as values: `status` and `result<T>`.
//
// Every fallible call in cclite returns a `status` (success or an error code
// with a message a user can act on) or a `result<T>` (a value or a status).
// Nothing in the library throws; `result<T>::value()` on an error throws
// `cclite::error` when exceptions are enabled and aborts with the message
// otherwise, so callers who prefer exceptions write `comm.allreduce(...).value()`.
//
// Recovery semantics (as in Gloo's docs/errors.md): after `timeout`,
// `peer_lost`, `mismatch` or `aborted` the communicator is unusable; destroy it
// and build a new one. `invalid_argument` and `unsupported` leave it usable.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <string>
#include <utility>

#include <cclite/config.hpp>

#if CCLITE_HAS_EXCEPTIONS
#include <stdexcept>
#endif

namespace cclite {

/// Error codes. Stable names: they appear in log lines and messages.
enum class errc : int {
  ok = 0,
  invalid_argument,    ///< caller-checkable precondition failed (null buffer, root out of range)
  timeout,             ///< a deadline (CCLITE_TIMEOUT or a per-call one) passed
  peer_lost,           ///< a peer died or its connection broke
  mismatch,            ///< ranks called different collectives / counts / dtypes / ops / roots
  no_transport,        ///< no transport in the compile-time list can reach a peer
  unsupported,         ///< combination not available in this build or on this machine
  system_error,        ///< an OS call failed; the message carries errno text
  aborted,             ///< communicator::abort() was called
  protocol_error,      ///< malformed or unexpected bytes from the wire or the store
  bootstrap_error,     ///< launcher environment missing or contradictory; rendezvous failed
  resource_exhausted,  ///< out of memory, segments, descriptors
};

/// Short stable name of an error code ("peer_lost").
inline const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid_argument";
    case errc::timeout: return "timeout";
    case errc::peer_lost: return "peer_lost";
    case errc::mismatch: return "mismatch";
    case errc::no_transport: return "no_transport";
    case errc::unsupported: return "unsupported";
    case errc::system_error: return "system_error";
    case errc::aborted: return "aborted";
    case errc::protocol_error: return "protocol_error";
    case errc::bootstrap_error: return "bootstrap_error";
    case errc::resource_exhausted: return "resource_exhausted";
  }
  return "unknown";
}

namespace detail {
// Out of line on purpose (noinline): every status is copied, moved and
// destroyed in hundreds of places, and these keep each of those sites to a
// pointer move and a null test (hello_allreduce at -O2: 412 -> 395 KiB with
// result<T>'s out-of-line check below).
[[gnu::noinline]] inline std::string* copy_message(const std::string* m) {
  return m ? new std::string(*m) : nullptr;
}
[[gnu::noinline]] inline void free_message(std::string* m) noexcept { delete m; }
}  // namespace detail

// status and result are [[nodiscard]]: an error nobody looks at is a bug.
// Not in CUDA translation units: nvcc's front end (EDG) also reports every
// discarded `status&` that an assignment returns (warning 2810), i.e. each
// `st = other;` in these headers and in the program. g++ builds still check.
#if defined(__CUDACC__)
#define CCLITE_NODISCARD_TYPE
#else
#define CCLITE_NODISCARD_TYPE [[nodiscard]]
#endif

/// Success, or an error code with a human-readable message.
/// A successful status holds no string and never allocates. The message
/// lives on the heap behind one pointer, so moving a status is two words.
class CCLITE_NODISCARD_TYPE status {
 public:
  status() noexcept = default;
  /// An empty message allocates nothing (the wait loops' "slice expired"
  /// timeouts rely on it: no allocation in a collective, tests/alloc_test).
  status(errc code, std::string message)
      : code_(code), message_(message.empty() ? nullptr : new std::string(std::move(message))) {}
  status(const status& o) : code_(o.code_), message_(detail::copy_message(o.message_)) {}
  /// A moved-from status keeps its code and loses its message.
  status(status&& o) noexcept : code_(o.code_), message_(o.message_) { o.message_ = nullptr; }
  status& operator=(const status& o) {
    if (this != &o) *this = status(o);
    return *this;
  }
  status& operator=(status&& o) noexcept {
    if (this == &o) return *this;
    if (message_) detail::free_message(message_);
    code_ = o.code_;
    message_ = o.message_;
    o.message_ = nullptr;
    return *this;
  }
  ~status() {
    if (message_) detail::free_message(message_);
  }

  bool ok() const noexcept { return code_ == errc::ok; }
  explicit operator bool() const noexcept { return ok(); }
  errc code() const noexcept { return code_; }
  const std::string& message() const noexcept {
    static const std::string none;
    return message_ ? *message_ : none;
  }

  /// "peer_lost: rank 3 (node1, pid 4242) lost during allreduce #57"
  std::string to_string() const {
    if (ok()) return "ok";
    return std::string(cclite::to_string(code_)) + ": " + message();
  }

 private:
  errc code_ = errc::ok;
  std::string* message_ = nullptr;
};

/// printf-style constructor for error statuses.
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
inline status make_error(errc code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return status(code, buf);
}

#if CCLITE_HAS_EXCEPTIONS
/// Thrown only by result<T>::value() / status_value() on an error.
class error : public std::runtime_error {
 public:
  explicit error(status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}
  const cclite::status& get_status() const noexcept { return status_; }

 private:
  cclite::status status_;
};
#endif

namespace detail {
/// What value() does on an error. Without exceptions the message is printed
/// and the process aborts (tl::expected / fmt do the same).
[[noreturn]] inline void fail(const status& s) {
#if CCLITE_HAS_EXCEPTIONS
  throw error(s);
#else
  std::fprintf(stderr, "cclite: fatal: %s\n", s.to_string().c_str());
  std::abort();
#endif
}
}  // namespace detail

namespace detail {
/// What a result<T> built from an ok status holds instead (out of line: one
/// copy for every T).
[[gnu::noinline]] inline status ok_is_not_an_error() {
  return status(errc::invalid_argument, "result built from an ok status");
}
}  // namespace detail

/// A value of type T, or the status saying why there is none.
///
/// The value is kept in a union rather than a std::optional<T>: a program
/// instantiates result<T> for ~60 types, and optional's layers of payload
/// classes were ~10 % of the functions the compiler had to build for a TU
/// that calls init() (bench/footprint.sh). Its functions are compiled for
/// size (config.hpp): results carry set-up's values (stores, links, options),
/// while collectives return a plain status.
CCLITE_SETUP_CODE_BEGIN
template <class T>
class CCLITE_NODISCARD_TYPE result {
 public:
  result(T value) { emplace(std::move(value)); }  // NOLINT: implicit by design
  result(status s) : status_(s.ok() ? detail::ok_is_not_an_error() : std::move(s)) {}  // NOLINT: implicit
  result(result&& o) noexcept(std::is_nothrow_move_constructible_v<T>) : status_(std::move(o.status_)) {
    if (o.has_) emplace(std::move(o.value_));
  }
  result(const result& o) : status_(o.status_) {
    if (o.has_) emplace(o.value_);
  }
  result& operator=(result&& o) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (this == &o) return *this;
    reset();
    status_ = std::move(o.status_);
    if (o.has_) emplace(std::move(o.value_));
    return *this;
  }
  result& operator=(const result& o) {
    if (this == &o) return *this;
    reset();
    status_ = o.status_;
    if (o.has_) emplace(o.value_);
    return *this;
  }
  ~result() { reset(); }

  bool ok() const noexcept { return has_; }
  explicit operator bool() const noexcept { return ok(); }
  const status& error() const noexcept { return status_; }

  T& value() & {
    if (!ok()) detail::fail(status_);
    return value_;
  }
  const T& value() const& {
    if (!ok()) detail::fail(status_);
    return value_;
  }
  T&& value() && {
    if (!ok()) detail::fail(status_);
    return std::move(value_);
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }

 private:
  // has_ only once T is built: a throwing constructor leaves no value to destroy.
  template <class U>
  void emplace(U&& v) {
    new (&value_) T(std::forward<U>(v));
    has_ = true;
  }
  void reset() noexcept {
    if (has_) value_.~T();
    has_ = false;
  }

  union {
    T value_;  // alive exactly when has_
  };
  status status_;
  bool has_ = false;
};
CCLITE_SETUP_CODE_END

/// Throws/aborts if `s` is an error; for callers who want exception semantics.
inline void check(const status& s) {
  if (!s.ok()) detail::fail(s);
}

}  // namespace cclite

/// Propagates an error status from an expression returning `status`.
#define CCLITE_TRY(expr)                          \
  do {                                            \
    ::cclite::status cclite_try_s_ = (expr);      \
    if (!cclite_try_s_.ok()) return cclite_try_s_; \
  } while (0)
