# GPU tests: compiled, linked and run in every build that has the CUDA toolkit. Without a GPU
# each prints "skipped: no CUDA device (...)" and passes; test/gpu/check.sh runs them on one.
# gpu_test_backends reaches the backend as the binary does: through the plugin beside it.
if(STRATAGEM_HAVE_CUDA)
  add_executable(gpu_test_backends ${CMAKE_SOURCE_DIR}/test/gpu/test_backends.cpp)
  target_link_libraries(gpu_test_backends PRIVATE stratagem_lib Boost::unit_test_framework)
  target_compile_definitions(gpu_test_backends PRIVATE BOOST_TEST_DYN_LINK)
  add_dependencies(gpu_test_backends stratagem_cuda)
  add_test(NAME gpu.backends COMMAND gpu_test_backends)
  set_tests_properties(gpu.backends PROPERTIES LABELS "gpu" TIMEOUT 600)
endif()
# Training on the cuda backend against the cpu one (and tp 2 x pp 2 on one GPU against 1
# rank); without a GPU it checks that --backend cuda is refused with exit 2.
add_test(NAME gpu.train_matches_cpu COMMAND bash ${CMAKE_SOURCE_DIR}/test/gpu/train_matches_cpu.sh)
set_tests_properties(gpu.train_matches_cpu PROPERTIES LABELS "gpu;mpi" TIMEOUT 600
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
