# The benchmark's reference trainers (bench/reference_mlp.py) run from the repository.
add_test(NAME bench_reference
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_reference.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_reference PROPERTIES LABELS "integration;bench" SKIP_RETURN_CODE 77)
