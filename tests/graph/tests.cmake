td_add_test(test_graph SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_graph.cpp LABELS unit graph
            LIBS traindeck_backend)
td_add_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.cpp LABELS unit graph ops
            LIBS traindeck_backend)
td_add_test(test_precision SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_precision.cpp
            LABELS unit graph precision LIBS traindeck_backend traindeck_io)
# Every kernel over every backend (each CUDA device, the CPU on one thread) against cpu:0.
td_add_test(test_backend_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_ops.cpp
            LABELS integration graph ops LIBS traindeck_backend traindeck_io)
# The image preprocessing and augmentation layers on the CPU device: against Keras 3 (SKIP of those
# comparisons without it), their keyed draws, and a project trained through the CLI.
td_add_test(test_augment SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_augment.cpp
            LABELS integration graph ops LIBS traindeck_backend)
add_dependencies(test_augment traindeck)
# The data panel's preview after the model's leading augmentation layers (engine/api), against the
# training program's own nodes for those layers.
td_add_test(test_augment_preview SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_augment_preview.cpp
            LABELS unit graph LIBS traindeck_api)
