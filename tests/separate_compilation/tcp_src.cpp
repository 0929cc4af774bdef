// The one TU of tcp_main.cpp's program that compiles cclite's set-up code: the
// default communicator (src.hpp) and communicator<tcp::transport>, which
// tcp_main.cpp declares extern.
#include <cclite/src.hpp>

CCLITE_INSTANTIATE_COMMUNICATOR(cclite::tcp::transport)
