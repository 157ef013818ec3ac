# Strategy-search benchmarks: search time, candidates evaluated, forecast throughput against the
# megatron and zero baselines on the issue's cases, and the speedup of mpirun -np 2.
add_executable(bench_search ${CMAKE_CURRENT_LIST_DIR}/bench_search.cpp)
target_link_libraries(bench_search PRIVATE stratagem_lib)
string(JOIN " " STRATAGEM_MPIEXEC_LINE ${STRATAGEM_MPIEXEC})
target_compile_definitions(bench_search PRIVATE STRATAGEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                           STRATAGEM_MPIEXEC="${STRATAGEM_MPIEXEC_LINE}")
set_target_properties(bench_search PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
