// cclite/collective/separate_compilation.hpp - compile a communicator's set-up
// code once per program instead of once per translation unit.
//
// cclite is header-only: every TU that creates a communicator compiles the
// communicator's set-up code (connecting, topology, algorithm selection,
// failure handling) and every TU that calls cclite::init() the stores and the
// launcher detection as well: half of the 12-13 s such a TU takes at -O2 on a
// 2-CPU VM (samples/hello_allreduce.cpp; README "Separate compilation"). A
// program with several such TUs, or one rebuilt often, can compile that code
// once, the way Asio's ASIO_SEPARATE_COMPILATION does:
//
//   1. define CCLITE_SEPARATE_COMPILATION for every TU of the program (the
//      same CCLITE_* macros everywhere, as for any header library);
//   2. in exactly one TU (a file of its own is best):
//        #include <cclite/src.hpp>
//
// <cclite/cclite.hpp> then declares the default communicator
// (cclite::default_communicator) and cclite::init() as instantiated elsewhere
// (`extern template`), so its TUs compile only the collectives they call
// (the algorithms, the links' data path: member templates instantiated per
// call); src.hpp's TU compiles the rest, once.
//
// Another transport set (e.g. communicator<tcp::transport> on a board), at
// global scope:
//   CCLITE_EXTERN_COMMUNICATOR(cclite::tcp::transport)       // a header every TU includes
//   CCLITE_INSTANTIATE_COMMUNICATOR(cclite::tcp::transport)  // the TU of src.hpp, after it
// (Not the default set itself: src.hpp compiles it, and a second explicit
// instantiation does not compile. In a tcp-only build the default set is
// communicator<tcp::transport>.) A transport set nobody declared extern is
// compiled in every TU as in the header-only build: correct, only slower.
//
// Costs: src.hpp's TU takes ~15-20 s (it compiles every member of the
// communicator, called or not); the program gets the unused members too
// unless it links with -Wl,--gc-sections (each instantiated member has a
// section of its own, so the linker can drop it).
#pragma once

#include <cclite/config.hpp>
#include <cclite/collective/communicator.hpp>
#include <cclite/collective/init.hpp>

// The layers of communicator<Transports...> (collective/comm_*.hpp), its
// environment wrapper and init_communicator<>, each explicitly instantiated
// (`template`) or declared so (`extern template`). Member templates (the
// per-kind and per-type code of each collective) are not covered: each TU
// instantiates those it calls.
#define CCLITE_COMMUNICATOR_INSTANTIATION_(PREFIX, ...)                                                    \
  namespace cclite {                                                                                      \
  PREFIX template class detail::comm_core<__VA_ARGS__>;                                                   \
  PREFIX template class detail::comm_checks<__VA_ARGS__>;                                                 \
  PREFIX template class detail::comm_algorithms<__VA_ARGS__>;                                             \
  PREFIX template class detail::comm_shared<__VA_ARGS__>;                                                 \
  PREFIX template class detail::comm_dispatch<communicator<__VA_ARGS__>, __VA_ARGS__>;                    \
  PREFIX template class communicator<__VA_ARGS__>;                                                        \
  PREFIX template class env_communicator<communicator<__VA_ARGS__>>;                                      \
  PREFIX template result<env_communicator<communicator<__VA_ARGS__>>> init_communicator<communicator<__VA_ARGS__>>( \
      comm_options);                                                                                      \
  }

/// Declares communicator<Transports...> as compiled in another TU (at global
/// scope, before any use; fully qualified transport names).
#define CCLITE_EXTERN_COMMUNICATOR(...) CCLITE_COMMUNICATOR_INSTANTIATION_(extern, __VA_ARGS__)
/// Compiles communicator<Transports...> here: in the TU of <cclite/src.hpp>.
#define CCLITE_INSTANTIATE_COMMUNICATOR(...) CCLITE_COMMUNICATOR_INSTANTIATION_(, __VA_ARGS__)
