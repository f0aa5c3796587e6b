# GUI tests: run offscreen (QT_QPA_PLATFORM=offscreen is set by td_add_test).
td_add_test(test_ui SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ui.cpp LABELS gui GUI)
td_add_test(test_run_controller SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_run_controller.cpp
            LABELS gui GUI)
td_add_test(test_runs_resume SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runs_resume.cpp
            LABELS gui GUI)
td_add_test(test_ui_export SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ui_export.cpp LABELS gui GUI)

# Fills a store with many runs for installer/gui_runs_latency.sh (not a test itself).
add_executable(td_fill_store ${CMAKE_CURRENT_LIST_DIR}/fill_store.cpp)
target_compile_options(td_fill_store PRIVATE ${TRAINDECK_WARNINGS})
target_link_libraries(td_fill_store PRIVATE traindeck_store)

# The UI reaches the engine only through engine/api (and the plain types of engine/core).
add_test(NAME ui_includes_only_api
         COMMAND ${CMAKE_COMMAND} -DUI_DIR=${PROJECT_SOURCE_DIR}/ui
                 -P ${CMAKE_CURRENT_LIST_DIR}/check_ui_includes.cmake)
set_tests_properties(ui_includes_only_api PROPERTIES LABELS unit)
# ... and that check fails, naming the file, line and header, on a file that does not.
add_test(NAME ui_include_check_fails
         COMMAND ${CMAKE_COMMAND} -DUI_DIR=${CMAKE_CURRENT_LIST_DIR}/include_fixture
                 -P ${CMAKE_CURRENT_LIST_DIR}/check_ui_includes.cmake)
set_tests_properties(ui_include_check_fails PROPERTIES LABELS unit
  PASS_REGULAR_EXPRESSION "include_fixture/reaches_past_api.h:5: includes engine/store/run_store.h")
# The app watching and steering runs on a server over SSH (a test-started sshd; skipped without
# openssh-server).
td_add_test(test_ui_remote SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ui_remote.cpp
            LABELS gui integration GUI)
if(TARGET test_ui_remote)  # GUI tests exist only in builds with the desktop app
  add_dependencies(test_ui_remote traindeck)
endif()
