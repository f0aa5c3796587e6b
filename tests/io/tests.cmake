td_add_test(test_io SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_io.cpp LABELS unit io LIBS traindeck_io)
td_add_test(test_keras_fixtures SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_keras_fixtures.cpp
            LABELS unit io LIBS traindeck_io traindeck_compiler)
