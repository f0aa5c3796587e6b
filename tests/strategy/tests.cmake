td_add_test(test_replica_group SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_replica_group.cpp
            LABELS unit distribute LIBS traindeck_distribute)
td_add_test(test_strategies SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_strategies.cpp
            LABELS integration distribute)
# MultiWorkerMirrored through the binary under mpirun (one job at a time: RESOURCE_LOCK mpi).
foreach(case equal off kill hang chief resume resume_mid)
  add_test(NAME mwms_${case}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_mwms.sh $<TARGET_FILE:traindeck>
                   ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(mwms_${case} PROPERTIES LABELS "integration;distribute"
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK mpi TIMEOUT 400)
endforeach()
