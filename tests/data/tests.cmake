td_add_test(test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cpp LABELS unit data LIBS traindeck_data)
# The tests write gzip fixtures themselves.
target_link_libraries(test_data PRIVATE ZLIB::ZLIB)
# The cache through whole training runs: needs the engine.
td_add_test(test_pipeline_training SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_training.cpp
            LABELS integration data)
td_add_test(test_data_limits SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_limits.cpp
            LABELS unit data LIBS traindeck_data)
target_link_libraries(test_data_limits PRIVATE ZLIB::ZLIB)
# The image_directory source; its fixtures are written with the format libraries' encoders.
td_add_test(test_image_folder SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_image_folder.cpp
            LABELS unit data LIBS traindeck_data)
target_link_libraries(test_image_folder PRIVATE JPEG::JPEG PNG::PNG nlohmann_json::nlohmann_json)
# TFRecord files and tf.train.Example; GZIP fixtures written with zlib.
td_add_test(test_tfrecord SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tfrecord.cpp
            LABELS unit data LIBS traindeck_data)
target_link_libraries(test_tfrecord PRIVATE ZLIB::ZLIB)
# Streaming an image folder larger than the memory budget through the CLI (peak memory of the
# process, the refusal of a memory cache, a bad file met mid-epoch); skip_bad_files and a cache
# before the decode through the CLI, the store's log read back (the engine's run catalog).
td_add_test(test_streaming SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_streaming.cpp
            LABELS integration data cli)
add_dependencies(test_streaming traindeck)
