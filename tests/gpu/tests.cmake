# Run-time kernel sources through NVRTC (no GPU needed); SKIP (77) on a build without CUDA.
add_executable(test_nvrtc ${CMAKE_CURRENT_LIST_DIR}/test_nvrtc.cpp)
target_compile_options(test_nvrtc PRIVATE ${TRAINDECK_WARNINGS})
target_link_libraries(test_nvrtc PRIVATE traindeck_compiler)
add_test(NAME test_nvrtc COMMAND test_nvrtc)
set_tests_properties(test_nvrtc PROPERTIES LABELS "unit;cuda" SKIP_RETURN_CODE 77)
