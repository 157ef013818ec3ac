# `stratagem report`: the CLI and page structure (label: report; the measured run uses mpirun),
# and the pages in headless chromium (skipped, exit 77, where chromium is absent).
add_test(NAME report.cli COMMAND bash ${CMAKE_SOURCE_DIR}/test/report/cli.sh)
set_tests_properties(report.cli PROPERTIES LABELS "report;mpi" TIMEOUT 300
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
add_test(NAME report.browser COMMAND bash ${CMAKE_SOURCE_DIR}/test/report/browser.sh)
set_tests_properties(report.browser PROPERTIES LABELS "report" TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
