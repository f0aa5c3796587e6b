td_add_test(test_training SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_training.cpp
            LABELS integration engine)
td_add_test(test_cli SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cli.cpp LABELS integration cli)
add_dependencies(test_cli traindeck)
# Store safety, signals and refused input through the CLI (real processes, a schema-5 store made
# with SQLite directly).
td_add_test(test_cli_faults SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cli_faults.cpp
            LABELS integration cli)
add_dependencies(test_cli_faults traindeck)
target_link_libraries(test_cli_faults PRIVATE SQLite::SQLite3)
# The shipped projects killed mid-epoch and resumed == uninterrupted, bit for bit (a few minutes).
td_add_test(test_resume_exact SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_resume_exact.cpp
            LABELS integration cli)
add_dependencies(test_resume_exact traindeck)
set_tests_properties(test_resume_exact PROPERTIES TIMEOUT 1800)
# Under the sanitizers the CNN and the wide MLP would take most of CI's time: the seed MLP's two
# rows prove the same there.
if(TRAINDECK_SANITIZE)
  target_compile_definitions(test_resume_exact PRIVATE TD_RESUME_EXACT_SMALL_ONLY=1)
endif()
if(TRAINDECK_HAVE_GUI)
  target_compile_definitions(test_cli PRIVATE TRAINDECK_HAVE_GUI=1)
endif()
# The CUDA device against the CPU reference; exits 77 (skipped) where no GPU answers.
td_add_test(test_cuda_device SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_device.cpp
            LABELS integration gpu)
set_tests_properties(test_cuda_device PROPERTIES SKIP_RETURN_CODE 77)
# NVML figures, PCI bus ids and the NCCL-between-workers agreement: what runs without a GPU.
td_add_test(test_device_telemetry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_telemetry.cpp
            LABELS unit engine)
# The CPU device's WorkShare: pieces of products and of the update on the other cores.
td_add_test(test_work_share SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_work_share.cpp
            LABELS unit engine)
# Its own OpenMP regions: a step run from inside an active region (the team's nested region).
target_link_libraries(test_work_share PRIVATE OpenMP::OpenMP_CXX)
# The layer table of docs/ARCHITECTURE.md, held against every include and every engine library;
# and the check names each include planted against it.
add_test(NAME layer_rules COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                                  -P ${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake)
set_tests_properties(layer_rules PROPERTIES LABELS unit)
add_test(NAME layer_rules_catch_planted
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/layer_rules_planted
                 -P ${CMAKE_CURRENT_LIST_DIR}/check_layers_planted.cmake)
set_tests_properties(layer_rules_catch_planted PROPERTIES LABELS unit)
# SystemLibrary (engine/core/module_loader.h) against a real system library, glibc's libm.
td_add_test(test_module_loader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_loader.cpp
            LABELS unit engine LIBS traindeck_core ${CMAKE_DL_LIBS})
# The CLI over a real SSH connection (a test-started sshd; skipped without openssh-server).
td_add_test(test_remote SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_remote.cpp LABELS integration cli)
add_dependencies(test_remote traindeck)
