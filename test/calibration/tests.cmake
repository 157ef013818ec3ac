# The estimator against published Megatron-LM A100 runs (../shared/calibration).
stratagem_boost_test(calibration_test ${CMAKE_CURRENT_LIST_DIR}/test_calibration.cpp)
add_test(NAME calibration.megatron COMMAND calibration_test)
set_tests_properties(calibration.megatron PROPERTIES LABELS calibration)
