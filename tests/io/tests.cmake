td_add_test(test_io SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_io.cpp LABELS unit io LIBS traindeck_io)
