# Issue 30: nothing destroyed, nothing hangs, every limit refused. Each script drives the
# production CLI (label: mpi where it launches ranks) and asserts exit codes and the one line.
# disk_full.sh needs a private mount namespace (unshare -m) for a small tmpfs: it skips (77) only
# where the namespace cannot be made. limits.sh (issue 41): checked arithmetic, the start-up
# timeout of every command, memory pre-checks; outputs_inputs.sh (issue 41): outputs that are
# the run's own inputs, resume settings against the checkpoint, names in job files; inputs.sh
# (issue 41): JSON depth, regular files of bounded size, nonsense flags.
foreach(name outputs outputs_inputs checkpoint_folder flags memory signals disk_full limits
             inputs)
  add_test(NAME reliability.${name} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/${name}.sh)
  set_tests_properties(reliability.${name} PROPERTIES LABELS "mpi;reliability" TIMEOUT 300
                       SKIP_RETURN_CODE 77
                       ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
endforeach()
