# GUI tests: run offscreen (QT_QPA_PLATFORM=offscreen is set by td_add_test).
td_add_test(test_ui SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ui.cpp LABELS gui GUI)
td_add_test(test_run_controller SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_run_controller.cpp
            LABELS gui GUI)
