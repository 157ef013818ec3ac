# Layers point one way (label: unit): every include follows an arrow of docs/ARCHITECTURE.md.
add_test(NAME architecture.layers
         COMMAND python3 ${CMAKE_SOURCE_DIR}/test/architecture/layers.py ${CMAKE_SOURCE_DIR})
set_tests_properties(architecture.layers PROPERTIES LABELS "unit;architecture" TIMEOUT 60)
# Tests that share a machine (label: unit): each has its own TMPDIR and MPI session directory.
add_test(NAME architecture.isolation
         COMMAND python3 ${CMAKE_SOURCE_DIR}/test/architecture/isolation.py ${CMAKE_BINARY_DIR})
set_tests_properties(architecture.isolation PROPERTIES LABELS "unit;architecture" TIMEOUT 60)
