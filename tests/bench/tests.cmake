# The benchmark's reference trainers (bench/reference_mlp.py) run from the repository.
add_test(NAME bench_reference
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_reference.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_reference PROPERTIES LABELS "integration;bench" SKIP_RETURN_CODE 77)
# traindeck_bench --matmul-rate measures oneDNN's products right after TrainDeck's run.
if(TARGET traindeck_bench AND TARGET traindeck_bench_matmul)
  add_test(NAME bench_matmul_rate
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_matmul_rate.sh $<TARGET_FILE:traindeck_bench>)
  set_tests_properties(bench_matmul_rate PROPERTIES LABELS "integration;bench"
                       ENVIRONMENT "XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/test-cache")
endif()
