# Export and import: zip, HDF5, .keras and ONNX files (engine/io) and the facade engine/api/export.h.
td_add_test(test_export SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_export.cpp LABELS unit export)
target_link_libraries(test_export PRIVATE ZLIB::ZLIB)
