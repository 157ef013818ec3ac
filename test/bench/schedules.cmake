# The zero-bubble schedules in the search (issue 40): per case, the best plan with them and with
# 1F1B/interleaved only, side by side, and the search time of each.
add_executable(bench_schedules ${CMAKE_CURRENT_LIST_DIR}/bench_schedules.cpp)
target_link_libraries(bench_schedules PRIVATE stratagem_lib)
target_compile_definitions(bench_schedules PRIVATE STRATAGEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_target_properties(bench_schedules PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
