# traindeck_backend: the optimizer update inside a compiled step (programUpdateMatchesApply).
td_add_test(test_optim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim.cpp LABELS unit train
            LIBS traindeck_train traindeck_backend)
td_add_test(test_checkpoint SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp
            LABELS integration train)
# The TD_HOST_DEVICE math the CUDA kernels run, checked against the CPU kernels.
td_add_test(test_shared_math SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shared_math.cpp
            LABELS unit train LIBS traindeck_train traindeck_backend)
