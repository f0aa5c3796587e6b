# Run-time kernel sources through NVRTC (no GPU needed); SKIP (77) on a build without CUDA.
add_executable(test_nvrtc ${CMAKE_CURRENT_LIST_DIR}/test_nvrtc.cpp)
target_compile_options(test_nvrtc PRIVATE ${TRAINDECK_WARNINGS})
target_link_libraries(test_nvrtc PRIVATE traindeck_backend)
add_test(NAME test_nvrtc COMMAND test_nvrtc)
set_tests_properties(test_nvrtc PROPERTIES LABELS "unit;cuda" SKIP_RETURN_CODE 77)
# The GPU matmul benchmark: bad options refused by name; on a GPU it measures, else SKIP (77).
if(TARGET traindeck_bench_cuda_matmul)
  add_test(NAME bench_cuda_matmul
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_matmul_check.sh
                   $<TARGET_FILE:traindeck_bench_cuda_matmul>)
  set_tests_properties(bench_cuda_matmul PROPERTIES LABELS "integration;cuda;bench"
                       SKIP_RETURN_CODE 77)
endif()
# The GPU pooling / BatchNormalization / conv benchmark against cuDNN: bad options refused by
# name; on a GPU it measures and checks its results, else SKIP (77).
if(TARGET traindeck_bench_cuda_ops)
  add_test(NAME bench_cuda_ops
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_ops_check.sh
                   $<TARGET_FILE:traindeck_bench_cuda_ops>)
  set_tests_properties(bench_cuda_ops PROPERTIES LABELS "integration;cuda;bench"
                       SKIP_RETURN_CODE 77)
endif()
# The GPU machine's bundle (tests/gpu/check.sh --bundle), proven here without a GPU: it builds
# with the CUDA backend forced on, and its executables start with the loader pointed at the bundle
# alone and list no cuda: device (check.sh --verify). The bundle build shares ccache with this
# build. SKIP (77) without the CUDA toolkit, and in builds configured with TRAINDECK_CUDA=OFF
# (the sanitizer builds).
if(TRAINDECK_HAVE_CUDA)
  add_test(NAME gpu_bundle COMMAND ${CMAKE_COMMAND} -E env TRAINDECK_GPU_REBUNDLE=1
                                   ${PROJECT_SOURCE_DIR}/tests/gpu/check.sh --verify)
else()
  add_test(NAME gpu_bundle COMMAND ${CMAKE_COMMAND} -E echo
                                   "SKIP: this build has no CUDA backend (TRAINDECK_CUDA=${TRAINDECK_CUDA}, toolkit not found or turned off)")
  set_tests_properties(gpu_bundle PROPERTIES SKIP_REGULAR_EXPRESSION "SKIP:")
endif()
set_tests_properties(gpu_bundle PROPERTIES LABELS "integration;cuda;bundle" SKIP_RETURN_CODE 77
                     TIMEOUT 5400 RESOURCE_LOCK gpu_bundle)
