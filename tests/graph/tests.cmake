td_add_test(test_graph SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_graph.cpp LABELS unit graph
            LIBS traindeck_backend)
td_add_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.cpp LABELS unit graph ops
            LIBS traindeck_backend)
td_add_test(test_precision SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_precision.cpp
            LABELS unit graph precision LIBS traindeck_backend traindeck_io)
# Every kernel over every backend (each CUDA device, the CPU on one thread) against cpu:0.
td_add_test(test_backend_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_ops.cpp
            LABELS integration graph ops LIBS traindeck_backend traindeck_io)
