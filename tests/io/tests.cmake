td_add_test(test_io SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_io.cpp LABELS unit io LIBS traindeck_io)
# The binary as a user runs it, with every size and text field pushed to an absurd value.
td_add_test(test_limits SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_limits.cpp LABELS integration io)
add_dependencies(test_limits traindeck)
td_add_test(test_keras_fixtures SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_keras_fixtures.cpp
            LABELS unit io LIBS traindeck_io traindeck_backend)
