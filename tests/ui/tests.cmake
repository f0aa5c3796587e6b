# GUI tests: run offscreen (QT_QPA_PLATFORM=offscreen is set by td_add_test).
td_add_test(test_ui SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ui.cpp LABELS gui GUI)
td_add_test(test_run_controller SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_run_controller.cpp
            LABELS gui GUI)

# Fills a store with many runs for installer/gui_runs_latency.sh (not a test itself).
add_executable(td_fill_store ${CMAKE_CURRENT_LIST_DIR}/fill_store.cpp)
target_compile_options(td_fill_store PRIVATE ${TRAINDECK_WARNINGS})
target_link_libraries(td_fill_store PRIVATE traindeck_store)
