# Separate compilation (CCLITE_SEPARATE_COMPILATION, include/cclite/collective/
# separate_compilation.hpp), issue 8's compile time: test separate_compilation
# runs tests/separate_compilation_check.cmake on samples' hello_allreduce_separate:
#  - the program's object (hello_allreduce.cpp) defines none of the
#    communicator's layers' own members nor the set-up code of init()
#    (detail::env_store), and the object of cclite_src.cpp defines them: the
#    extern template declarations and CCLITE_DECL really keep that code out of
#    the program's TUs (a broken macro would compile it everywhere again and
#    still run);
#  - the program runs as 2 ranks over shm and 3 over tcp and sums correctly.
if(TARGET hello_allreduce_separate AND TARGET cclite-run)
  add_test(NAME separate_compilation
    COMMAND ${CMAKE_COMMAND} "-DNM=${CMAKE_NM}" "-DRUNNER=$<TARGET_FILE:cclite-run>"
            "-DPROGRAM=$<TARGET_FILE:hello_allreduce_separate>"
            "-DMAIN_OBJECTS=$<TARGET_OBJECTS:hello_allreduce_separate_main>"
            "-DSRC_OBJECTS=$<TARGET_OBJECTS:hello_allreduce_separate_src>"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/separate_compilation_check.cmake)
  set_tests_properties(separate_compilation PROPERTIES LABELS "embedded" TIMEOUT 300)
endif()
