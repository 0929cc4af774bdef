// cclite/src.hpp - the one translation unit of a program built with
// CCLITE_SEPARATE_COMPILATION (collective/separate_compilation.hpp):
//
//   // cclite_src.cpp, compiled with the program's flags and CCLITE_* macros
//   #include <cclite/src.hpp>
//
// It compiles, once for the program, the non-template set-up code (the stores,
// the launcher detection: functions marked CCLITE_DECL) and every member of
// cclite::default_communicator and of its cclite::init(). It must be the first
// cclite header of its TU, so that those definitions are compiled there.
#pragma once

#if !defined(CCLITE_SEPARATE_COMPILATION)
#error "<cclite/src.hpp> belongs to programs built with CCLITE_SEPARATE_COMPILATION: define it for every TU"
#endif
#if defined(CCLITE_VERSION_MAJOR) && !defined(CCLITE_SOURCE)
#error "<cclite/src.hpp> must be the first cclite header of its TU (it compiles definitions the others only declare)"
#endif
#define CCLITE_SOURCE 1

#include <cclite/cclite.hpp>

#if defined(CCLITE_DEFAULT_TRANSPORTS)
CCLITE_INSTANTIATE_COMMUNICATOR(CCLITE_DEFAULT_TRANSPORTS)
#endif
