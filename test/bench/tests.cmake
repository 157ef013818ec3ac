# Benchmarks: executables named bench_* in the build root, run by test/bench/run.sh (`make bench`),
# not by ctest. Each owner adds a test/bench/<topic>.cmake fragment; this file includes them all.
file(GLOB STRATAGEM_BENCH_FRAGMENTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cmake)
list(REMOVE_ITEM STRATAGEM_BENCH_FRAGMENTS ${CMAKE_CURRENT_LIST_FILE})
foreach(fragment ${STRATAGEM_BENCH_FRAGMENTS})
  include(${fragment})
endforeach()
