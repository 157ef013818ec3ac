# The simulator under MPI: results bit-identical to one process for several plans (the CLI at
# -np 2 and -np 4, and --mirror), and the parallel engine's internals with injected costs.
string(REPLACE ";" " " STRATAGEM_SIM_MPIEXEC "${STRATAGEM_MPIEXEC}")

stratagem_boost_test(mpi_test_sim_cli ${CMAKE_CURRENT_LIST_DIR}/test_sim_cli.cpp)
target_compile_definitions(mpi_test_sim_cli PRIVATE STRATAGEM_MPIEXEC_CMD="${STRATAGEM_SIM_MPIEXEC}")
add_test(NAME mpi.sim_cli_bit_identical COMMAND mpi_test_sim_cli)
set_tests_properties(mpi.sim_cli_bit_identical PROPERTIES LABELS "mpi;sim" TIMEOUT 900
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")

stratagem_boost_test(mpi_test_sim_pdes ${CMAKE_CURRENT_LIST_DIR}/test_sim_pdes.cpp)
foreach(np 2 3 4)
  add_test(NAME mpi.sim_pdes_np${np}
           COMMAND ${STRATAGEM_MPIEXEC} -np ${np} $<TARGET_FILE:mpi_test_sim_pdes>)
  set_tests_properties(mpi.sim_pdes_np${np} PROPERTIES LABELS "mpi;sim" TIMEOUT 300)
endforeach()

# The simulator's unit tests also carry the "sim" label (ctest -L sim).
foreach(t unit.test_sim_engine unit.test_sim_trace)
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY LABELS sim)
  endif()
endforeach()

# Rank symmetry: one representative per class of identical ranks equals every rank simulated,
# on one process and with the symmetric run spread over 2.
stratagem_boost_test(mpi_test_sim_symmetry ${CMAKE_CURRENT_LIST_DIR}/test_sim_symmetry.cpp)
add_test(NAME sim.symmetry_np1 COMMAND mpi_test_sim_symmetry)
add_test(NAME mpi.sim_symmetry_np2
         COMMAND ${STRATAGEM_MPIEXEC} -np 2 $<TARGET_FILE:mpi_test_sim_symmetry>)
set_tests_properties(sim.symmetry_np1 mpi.sim_symmetry_np2 PROPERTIES LABELS "mpi;sim" TIMEOUT 600)

# The engine's unit tests once more with every rank simulated (--full).
if(TARGET unit_test_sim_engine)
  add_test(NAME sim.engine_full COMMAND unit_test_sim_engine)
  set_tests_properties(sim.engine_full PROPERTIES LABELS "unit;sim" ENVIRONMENT STRATAGEM_TEST_FULL=1)
endif()

# The MPI communicator's asynchronous progress (the CPU backend's collectives overlap compute).
stratagem_boost_test(mpi_test_comm_progress ${CMAKE_CURRENT_LIST_DIR}/test_comm_progress.cpp)
add_test(NAME mpi.comm_progress
         COMMAND ${STRATAGEM_MPIEXEC} -np 2 $<TARGET_FILE:mpi_test_comm_progress> --log_level=message)
set_tests_properties(mpi.comm_progress PROPERTIES LABELS "mpi;runtime" TIMEOUT 120)
