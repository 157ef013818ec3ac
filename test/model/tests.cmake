# Models from the command line (label: model): Mixture-of-Experts and MLA in model show, the
# inline MoE flags, their errors, and the commands that refuse an MoE model until #26 lands.
add_test(NAME model.moe_cli COMMAND bash ${CMAKE_SOURCE_DIR}/test/model/moe_cli.sh)
set_tests_properties(model.moe_cli PROPERTIES LABELS "model" TIMEOUT 300
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
