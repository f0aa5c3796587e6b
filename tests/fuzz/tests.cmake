# Fuzz targets over the file readers and JSON parsers (tests/fuzz/fuzz_<name>.cpp).
#   replay_<name>: plain build of the target + replay_main, run by CTest over
#                  tests/fuzz/corpus/<name> and tests/fuzz/crashes/<name> (label unit)
#   fuzz_<name>:   libFuzzer binary, only with -DTRAINDECK_FUZZ=ON (clang)
set(TD_FUZZ_TARGETS idx:traindeck_data csv:traindeck_data npy:traindeck_data
    tfrecord:traindeck_data project:traindeck_io keras:traindeck_io keras_archive:traindeck_io
    checkpoint:traindeck_train)
foreach(entry ${TD_FUZZ_TARGETS})
  string(REPLACE ":" ";" parts ${entry})
  list(GET parts 0 fname)
  list(GET parts 1 flib)
  set(src ${CMAKE_CURRENT_LIST_DIR}/fuzz_${fname}.cpp)
  add_executable(replay_${fname} ${src} ${CMAKE_CURRENT_LIST_DIR}/replay_main.cpp)
  target_compile_options(replay_${fname} PRIVATE ${TRAINDECK_WARNINGS})
  target_link_libraries(replay_${fname} PRIVATE ${flib})
  add_test(NAME replay_${fname}
           COMMAND replay_${fname} ${CMAKE_CURRENT_LIST_DIR}/corpus/${fname}
                   ${CMAKE_CURRENT_LIST_DIR}/crashes/${fname})
  set_tests_properties(replay_${fname} PROPERTIES LABELS "unit;fuzz")
  if(TRAINDECK_FUZZ)
    add_executable(fuzz_${fname} ${src})
    target_compile_options(fuzz_${fname} PRIVATE ${TRAINDECK_WARNINGS})
    target_link_options(fuzz_${fname} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${fname} PRIVATE ${flib})
  endif()
endforeach()
