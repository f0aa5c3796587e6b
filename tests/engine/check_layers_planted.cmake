# check_layers.cmake must fail on a tree that breaks the layer table. Copies the sources to
# WORK_DIR, plants one include per kind of rule (a low folder reaching up, the UI reaching past
# engine/api, a library depending on a folder above it) and expects each to be named.
#   cmake -DSOURCE_DIR=<source root> -DWORK_DIR=<scratch folder> -P check_layers_planted.cmake
cmake_minimum_required(VERSION 3.20)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/docs")
file(COPY "${SOURCE_DIR}/engine" "${SOURCE_DIR}/ui" "${SOURCE_DIR}/app" DESTINATION "${WORK_DIR}")
file(COPY "${SOURCE_DIR}/docs/ARCHITECTURE.md" DESTINATION "${WORK_DIR}/docs")
file(COPY "${SOURCE_DIR}/CMakeLists.txt" DESTINATION "${WORK_DIR}")
set(checker "${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake")

function(expect_failure what pattern)
  execute_process(COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=${WORK_DIR} -P "${checker}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "check_layers passed a tree with ${what}")
  endif()
  if(NOT "${out}${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "check_layers failed on ${what} without naming it (${pattern}):\n${err}")
  endif()
  message(STATUS "refused: ${what}")
endfunction()

# The copy as it is passes.
execute_process(COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=${WORK_DIR} -P "${checker}"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_layers failed on the unchanged copy:\n${err}")
endif()

# 1. engine/core reaching up into engine/train (a cycle).
file(APPEND "${WORK_DIR}/engine/core/result.h" "#include \"engine/train/trainer.h\"\n")
expect_failure("engine/core including engine/train"
               "engine/core/result.h:[0-9]+: includes engine/train/trainer.h")
file(COPY "${SOURCE_DIR}/engine/core/result.h" DESTINATION "${WORK_DIR}/engine/core")

# 2. engine/graph reaching into the backend below it in the table's order.
file(APPEND "${WORK_DIR}/engine/graph/lower.h" "#include \"engine/backend/backend.h\"\n")
expect_failure("engine/graph including engine/backend"
               "engine/graph/lower.h:[0-9]+: includes engine/backend/backend.h")
file(COPY "${SOURCE_DIR}/engine/graph/lower.h" DESTINATION "${WORK_DIR}/engine/graph")

# 3. the UI reaching past engine/api.
file(APPEND "${WORK_DIR}/ui/main_window.h" "#include \"engine/store/run_store.h\"\n")
expect_failure("ui including engine/store" "ui/main_window.h:[0-9]+: includes engine/store")
file(COPY "${SOURCE_DIR}/ui/main_window.h" DESTINATION "${WORK_DIR}/ui")

# 4. a library linking a folder above it.
file(READ "${WORK_DIR}/CMakeLists.txt" text)
string(REPLACE "td_engine_module(model GLOBS engine/model/*.cpp DEPS traindeck_core)"
               "td_engine_module(model GLOBS engine/model/*.cpp DEPS traindeck_core traindeck_io)"
               planted "${text}")
if(planted STREQUAL text)
  message(FATAL_ERROR "check_layers_planted: the model library's line changed; update this test")
endif()
file(WRITE "${WORK_DIR}/CMakeLists.txt" "${planted}")
expect_failure("traindeck_model depending on traindeck_io"
               "traindeck_model depends on traindeck_io")
file(COPY "${SOURCE_DIR}/CMakeLists.txt" DESTINATION "${WORK_DIR}")

# 5. a new engine folder the table does not name.
file(MAKE_DIRECTORY "${WORK_DIR}/engine/extra")
file(WRITE "${WORK_DIR}/engine/extra/x.h" "#pragma once\n")
expect_failure("an engine folder without a row" "engine/extra: no row in the layer table")
file(REMOVE_RECURSE "${WORK_DIR}")
