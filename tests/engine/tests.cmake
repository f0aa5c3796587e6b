td_add_test(test_training SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_training.cpp
            LABELS integration engine)
td_add_test(test_cli SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cli.cpp LABELS integration cli)
target_compile_definitions(test_cli PRIVATE TRAINDECK_BINARY="$<TARGET_FILE:traindeck>")
add_dependencies(test_cli traindeck)
