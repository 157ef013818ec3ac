# Layers point one way (label: unit): every include follows an arrow of docs/ARCHITECTURE.md.
add_test(NAME architecture.layers
         COMMAND python3 ${CMAKE_SOURCE_DIR}/test/architecture/layers.py ${CMAKE_SOURCE_DIR})
set_tests_properties(architecture.layers PROPERTIES LABELS "unit;architecture" TIMEOUT 60)
