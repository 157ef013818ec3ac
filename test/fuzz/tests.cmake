# libFuzzer smoke (test/fuzz/run.sh smoke): each fuzz target replays its committed corpus and
# mutates it for ~2 s. Registered when clang++-14 is present; otherwise one line says it is
# skipped. `make fuzz` runs the long campaign.
find_program(STRATAGEM_CLANGXX14 clang++-14)
if(STRATAGEM_CLANGXX14)
  add_test(NAME fuzz.smoke COMMAND bash ${CMAKE_SOURCE_DIR}/test/fuzz/run.sh smoke)
  set_tests_properties(fuzz.smoke PROPERTIES LABELS fuzz TIMEOUT 1800 SKIP_RETURN_CODE 77
                       ENVIRONMENT "FUZZ_BUILD=${CMAKE_BINARY_DIR}-fuzz")
else()
  add_test(NAME fuzz.smoke
           COMMAND ${CMAKE_COMMAND} -E echo "fuzz.smoke: skipped: clang++-14 not found")
  set_tests_properties(fuzz.smoke PROPERTIES LABELS fuzz SKIP_REGULAR_EXPRESSION "skipped")
endif()
