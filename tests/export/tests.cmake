# Export and import: zip, HDF5, .keras and ONNX files (engine/io) and the facade engine/api/export.h.
td_add_test(test_export SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_export.cpp LABELS integration export)
target_link_libraries(test_export PRIVATE ZLIB::ZLIB)
add_dependencies(test_export traindeck)
# Against ONNX's checker, ONNX Runtime and Keras 3 (installer/pyenv.sh's environment); SKIP (77)
# when those packages are not installed.
add_test(NAME export_interop COMMAND ${CMAKE_CURRENT_LIST_DIR}/interop.sh $<TARGET_FILE:traindeck>)
set_tests_properties(export_interop PROPERTIES LABELS "integration;export" SKIP_RETURN_CODE 77
                     TIMEOUT 700)
