# The job scripts in jobs/ under a real single-node Slurm started by the test itself (munged,
# slurmctld, slurmd on this machine; see test/slurm/run.sh). It installs slurm-wlm and munge when
# missing and skips (exit 77) only when they cannot be installed. About 1-2 minutes; it uses
# both cores, so it runs alone. The script keeps its own 1500 s budget below TIMEOUT, so its EXIT
# trap always stops the daemons.
add_test(NAME slurm.jobs COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run.sh)
set_tests_properties(slurm.jobs PROPERTIES LABELS slurm TIMEOUT 1560 SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>;OMP_NUM_THREADS=1")
