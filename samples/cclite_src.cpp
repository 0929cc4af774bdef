// cclite_src.cpp - the one TU of a program built with CCLITE_SEPARATE_COMPILATION
// (include/cclite/collective/separate_compilation.hpp): it compiles cclite's
// set-up code and default communicator once, and the program's other TUs only
// the collectives they call. Copy it into a program, compile it with the same
// flags and CCLITE_* macros as the rest (samples/CMakeLists.txt:
// hello_allreduce_separate).
#include <cclite/src.hpp>
