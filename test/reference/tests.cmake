# The CPU Transformer against an independent PyTorch implementation (reference.py), run by the
# Debian interpreter that has torch and h5py (not whatever `python3` is first on PATH).
set(STRATAGEM_REFERENCE_PYTHON /usr/bin/python3 CACHE FILEPATH
    "Python with torch, h5py and numpy for test/reference")
stratagem_boost_test(reference_test ${CMAKE_CURRENT_LIST_DIR}/test_reference.cpp)
target_compile_definitions(reference_test PRIVATE
                           STRATAGEM_PYTHON="${STRATAGEM_REFERENCE_PYTHON}")
add_test(NAME reference.transformer COMMAND reference_test)
set_tests_properties(reference.transformer PROPERTIES LABELS reference TIMEOUT 600
                     ENVIRONMENT "OMP_NUM_THREADS=2")
# The same comparison through a tp 2 x pp 2 plan on four ranks (each checks its own shards).
add_test(NAME reference.transformer_tp2_pp2
         COMMAND ${STRATAGEM_MPIEXEC} -np 4 $<TARGET_FILE:reference_test>)
set_tests_properties(reference.transformer_tp2_pp2 PROPERTIES LABELS "reference;mpi" TIMEOUT 600
                     ENVIRONMENT "OMP_NUM_THREADS=1")
# One MoE FFN (router, top-k, experts, combine, shared experts, aux loss) against PyTorch.
stratagem_boost_test(moe_reference_test ${CMAKE_CURRENT_LIST_DIR}/test_moe_reference.cpp)
target_compile_definitions(moe_reference_test PRIVATE
                           STRATAGEM_PYTHON="${STRATAGEM_REFERENCE_PYTHON}")
add_test(NAME reference.moe_block COMMAND moe_reference_test)
set_tests_properties(reference.moe_block PROPERTIES LABELS reference TIMEOUT 300
                     ENVIRONMENT "OMP_NUM_THREADS=1")
# Expert parallelism's all-to-all dispatch and combine against the FFN that holds every expert,
# with the world as one ep group of 2 and of 4.
stratagem_boost_test(moe_ep_test ${CMAKE_CURRENT_LIST_DIR}/test_moe_ep.cpp)
add_test(NAME reference.moe_ep2 COMMAND ${STRATAGEM_MPIEXEC} -np 2 $<TARGET_FILE:moe_ep_test>)
add_test(NAME reference.moe_ep4 COMMAND ${STRATAGEM_MPIEXEC} -np 4 $<TARGET_FILE:moe_ep_test>)
set_tests_properties(reference.moe_ep2 reference.moe_ep4 PROPERTIES LABELS "reference;mpi"
                     TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")

# Context-parallel attention (ring, all-gather, all-to-all) on 2 and 4 ranks against one causal
# attention in PyTorch: output, log-sum-exp and the gradients of q, k, v.
stratagem_boost_test(cp_attention_test ${CMAKE_CURRENT_LIST_DIR}/test_cp_attention.cpp)
target_compile_definitions(
  cp_attention_test PRIVATE STRATAGEM_PYTHON="${STRATAGEM_REFERENCE_PYTHON}"
  STRATAGEM_ATTENTION_REFERENCE="${CMAKE_CURRENT_LIST_DIR}/attention_reference.py")
foreach(np 2 4)
  add_test(NAME reference.cp_attention_np${np}
           COMMAND ${STRATAGEM_MPIEXEC} -np ${np} $<TARGET_FILE:cp_attention_test>)
  set_tests_properties(reference.cp_attention_np${np} PROPERTIES LABELS "reference;mpi"
                       TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
