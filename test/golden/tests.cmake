# Golden forecasts (label: unit): estimate and simulate, byte for byte, on the plans of cases.txt.
add_test(NAME golden.forecasts COMMAND bash ${CMAKE_SOURCE_DIR}/test/golden/check.sh)
set_tests_properties(golden.forecasts PROPERTIES LABELS "unit;golden" TIMEOUT 600
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
