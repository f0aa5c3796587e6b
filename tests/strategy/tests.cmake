td_add_test(test_replica_group SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_replica_group.cpp
            LABELS unit distribute LIBS traindeck_distribute)
td_add_test(test_strategies SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_strategies.cpp
            LABELS integration distribute)
