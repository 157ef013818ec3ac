# The estimator against published Megatron-LM A100 runs (data/calibration).
stratagem_boost_test(calibration_test ${CMAKE_CURRENT_LIST_DIR}/test_calibration.cpp)
add_test(NAME calibration.megatron COMMAND calibration_test)
set_tests_properties(calibration.megatron PROPERTIES LABELS calibration)
stratagem_boost_test(calibration_sim_test ${CMAKE_CURRENT_LIST_DIR}/test_calibration_sim.cpp)
add_test(NAME calibration.megatron_simulated COMMAND calibration_sim_test)
set_tests_properties(calibration.megatron_simulated PROPERTIES LABELS "calibration;sim" TIMEOUT 300)
