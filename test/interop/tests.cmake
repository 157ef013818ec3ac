# Interop (label: interop): Hugging Face imports, Megatron-LM import and export round trips,
# torchtitan and DeepSpeed exports held against the frameworks' accepted names
# (test/data/frameworks/), cross-node tensor parallelism and jobs on part of a node.
add_test(NAME interop.cli COMMAND bash ${CMAKE_SOURCE_DIR}/test/interop/cli.sh)
set_tests_properties(interop.cli PROPERTIES LABELS "interop" TIMEOUT 900
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
add_test(NAME interop.defects COMMAND bash ${CMAKE_SOURCE_DIR}/test/interop/defects.sh)
set_tests_properties(interop.defects PROPERTIES LABELS "interop" TIMEOUT 900
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
