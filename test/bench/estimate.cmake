# Cost-model benchmarks: estimator calls per second, and the estimate against the published
# Megatron-LM runs (per-row error and MAPE).
foreach(bench bench_estimate bench_calibration)
  add_executable(${bench} ${CMAKE_CURRENT_LIST_DIR}/${bench}.cpp)
  target_link_libraries(${bench} PRIVATE stratagem_lib)
  target_compile_definitions(${bench} PRIVATE STRATAGEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  set_target_properties(${bench} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
endforeach()
