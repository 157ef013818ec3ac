# File digest (src/io/file_digest.hpp): sealing and verifying a checkpoint-sized file against
# reading it, side by side.
add_executable(bench_file_digest ${CMAKE_CURRENT_LIST_DIR}/bench_file_digest.cpp)
target_link_libraries(bench_file_digest PRIVATE stratagem_lib)
set_target_properties(bench_file_digest PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
