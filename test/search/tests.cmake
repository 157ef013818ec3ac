# Strategy search under MPI (label: mpi): -np 2 gives the same answer as -np 1.
add_test(NAME search.np2_equals_np1 COMMAND bash ${CMAKE_SOURCE_DIR}/test/search/np2_equals_np1.sh)
set_tests_properties(search.np2_equals_np1 PROPERTIES LABELS "mpi;search" TIMEOUT 600
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
