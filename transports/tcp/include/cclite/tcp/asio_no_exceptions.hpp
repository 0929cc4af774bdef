// cclite/tcp/asio_no_exceptions.hpp - lets standalone Asio build with -fno-exceptions.
//
// cclite only calls Asio's error_code overloads, so nothing is thrown on any
// path it uses. Asio still references asio::detail::throw_exception from the
// throwing overloads, and with ASIO_NO_EXCEPTIONS it leaves the definition to
// the application (see asio/detail/throw_exception.hpp). Without exceptions
// this header defines ASIO_NO_EXCEPTIONS and provides that definition: it
// prints the error and aborts, which is what an uncaught exception would do.
//
// The same goes for -fno-rtti: standalone Asio only learns that typeid is
// unavailable from ASIO_NO_TYPEID (Boost.Config is not used), so it is defined
// here when the compiler reports no RTTI.
//
// Include it before <asio.hpp> (every cclite tcp header does). An application
// that already defines asio::detail::throw_exception itself defines
// CCLITE_NO_ASIO_THROW_EXCEPTION to keep its own.
#pragma once

#include <cclite/config.hpp>

#if !defined(ASIO_NO_TYPEID) && !defined(__GXX_RTTI) && !defined(__cpp_rtti) && !defined(_CPPRTTI)
#define ASIO_NO_TYPEID 1
#endif

#if !CCLITE_HAS_EXCEPTIONS
#ifndef ASIO_NO_EXCEPTIONS
#define ASIO_NO_EXCEPTIONS 1
#endif

#include <cstdio>
#include <cstdlib>

#include <asio/detail/throw_exception.hpp>

#if !defined(CCLITE_NO_ASIO_THROW_EXCEPTION) && !defined(ASIO_HAS_BOOST_THROW_EXCEPTION)
namespace asio {
namespace detail {
template <typename Exception>
void throw_exception(const Exception& e) {
  std::fprintf(stderr, "cclite: fatal: asio error with exceptions disabled: %s\n", e.what());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail
}  // namespace asio
#endif
#endif  // !CCLITE_HAS_EXCEPTIONS
