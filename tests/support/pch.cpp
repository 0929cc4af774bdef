// Compiles the test programs' precompiled header (tests/CMakeLists.txt: cclite_test_pch).
