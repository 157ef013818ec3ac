# Runtime tests drive the production CLI under mpirun (label: mpi).
foreach(name parallel_equals_serial context_parallel resume_bit_exact reshard_checkpoint bad_input plan_refusals crash_safety
             data_formats profile failed_rank checkpoint_trust kill_points searched_plans
             zero_offload_matrix memory_forecast hdf5_guard moe_equals_serial schedules_equal_serial)
  if(EXISTS ${CMAKE_SOURCE_DIR}/test/runtime/${name}.sh)
    add_test(NAME runtime.${name} COMMAND bash ${CMAKE_SOURCE_DIR}/test/runtime/${name}.sh)
    set_tests_properties(runtime.${name} PROPERTIES LABELS "mpi;runtime" TIMEOUT 600
                         ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
  endif()
endforeach()
# All 100 kill points: `make test-long` (label long; `make test` leaves it out).
add_test(NAME runtime.kill_points_100 COMMAND bash ${CMAKE_SOURCE_DIR}/test/runtime/kill_points.sh)
set_tests_properties(runtime.kill_points_100 PROPERTIES LABELS "mpi;runtime;long" TIMEOUT 1800
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>;KILL_POINTS=100")
