# Every test gets a temporary folder of its own: TMPDIR, and Open MPI's session directory under
# it (orte_tmpdir_base for Open MPI 4, prte_tmpdir_base for 5). Under `ctest -j` two tests
# shared /tmp/ompi.HOST.UID, and one singleton's exit removed the folder another was starting
# in ("mkdir ... jf.0/1: No such file or directory" in MPI_Init_thread).
#
# The folders sit under one short base in /tmp, not in the build tree: PMIx puts its rendezvous
# socket in the session directory, and a Unix socket path holds at most 107 bytes, which a
# deep build folder would exceed. The base is named by a hash of the build folder, so two build
# trees on one machine (build, build-asan, the portability matrix) do not share it either.
# A fixture makes the folders before any test that needs them, so `ctest -R x` works alone.
string(MD5 _stratagem_build_hash "${CMAKE_BINARY_DIR}")
string(SUBSTRING "${_stratagem_build_hash}" 0 10 _stratagem_build_hash)
set(STRATAGEM_TEST_TMP_BASE "/tmp/stratagem-ctest-${_stratagem_build_hash}")
get_property(_stratagem_tests DIRECTORY PROPERTY TESTS)
set(_stratagem_test_dirs "")
set(_stratagem_index 0)
foreach(t ${_stratagem_tests})
  set(dir "${STRATAGEM_TEST_TMP_BASE}/${_stratagem_index}")
  math(EXPR _stratagem_index "${_stratagem_index} + 1")
  list(APPEND _stratagem_test_dirs "${dir}")
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "TMPDIR=${dir}"
               "OMPI_MCA_orte_tmpdir_base=${dir}" "PRTE_MCA_prte_tmpdir_base=${dir}")
  set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED stratagem_test_tmp)
endforeach()
add_test(NAME test_tmp.make COMMAND ${CMAKE_COMMAND} -E make_directory ${_stratagem_test_dirs})
set_tests_properties(test_tmp.make PROPERTIES FIXTURES_SETUP stratagem_test_tmp)
