# Simulator benchmark: events per second, GPT-3 175B on 1024 A100 (one iteration, one core) and
# the speedup of `mpirun -np 2 stratagem simulate` (runs the CLI; needs the stratagem target).
add_executable(bench_sim ${CMAKE_CURRENT_LIST_DIR}/bench_sim.cpp)
target_link_libraries(bench_sim PRIVATE stratagem_lib)
string(REPLACE ";" " " STRATAGEM_BENCH_MPIEXEC "${STRATAGEM_MPIEXEC}")
target_compile_definitions(bench_sim PRIVATE STRATAGEM_BIN="$<TARGET_FILE:stratagem>"
                           STRATAGEM_MPIEXEC_CMD="${STRATAGEM_BENCH_MPIEXEC}")
add_dependencies(bench_sim stratagem)
set_target_properties(bench_sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
