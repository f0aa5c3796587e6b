td_add_test(test_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model.cpp LABELS unit model LIBS traindeck_model)
