# The CUDA plugin's loading (src/runtime/cuda_plugin.cpp), in every build: the binary links no
# CUDA library, the plugin built beside it loads (when the toolkit was found), and a missing,
# foreign or broken plugin is named in one line.
foreach(kind OTHER_BUILD UNRESOLVED)
  string(TOLOWER ${kind} stem)
  add_library(fake_plugin_${stem} MODULE ${CMAKE_SOURCE_DIR}/test/plugin/fake_plugin.c)
  target_include_directories(fake_plugin_${stem} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(fake_plugin_${stem} PRIVATE FAKE_${kind}=1)
endforeach()
# A driver that shows one GPU, in a folder of its own (put on LD_LIBRARY_PATH by the test).
add_library(fake_driver MODULE ${CMAKE_SOURCE_DIR}/test/plugin/fake_driver.c)
set_target_properties(fake_driver PROPERTIES OUTPUT_NAME cuda PREFIX lib SUFFIX .so.1
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fake-driver)
stratagem_boost_test(plugin_test_cuda_plugin ${CMAKE_SOURCE_DIR}/test/plugin/test_cuda_plugin.cpp)
add_dependencies(plugin_test_cuda_plugin fake_plugin_other_build fake_plugin_unresolved fake_driver)
if(STRATAGEM_HAVE_CUDA)
  add_dependencies(plugin_test_cuda_plugin stratagem_cuda)
  target_compile_definitions(plugin_test_cuda_plugin PRIVATE STRATAGEM_PLUGIN_BUILT=1)
endif()
target_compile_definitions(plugin_test_cuda_plugin PRIVATE
  FAKE_OTHER_BUILD="$<TARGET_FILE:fake_plugin_other_build>"
  FAKE_UNRESOLVED="$<TARGET_FILE:fake_plugin_unresolved>"
  FAKE_DRIVER_DIR="$<TARGET_FILE_DIR:fake_driver>")
add_test(NAME plugin.cuda_plugin COMMAND plugin_test_cuda_plugin)
set_tests_properties(plugin.cuda_plugin PROPERTIES LABELS unit
                     ENVIRONMENT "STRATAGEM_BIN=$<TARGET_FILE:stratagem>")
