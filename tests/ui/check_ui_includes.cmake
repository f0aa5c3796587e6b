# The UI's only door into the engine is engine/api (plus the plain types of engine/core). Fails,
# naming each file, line and header, when a file under UI_DIR includes any other engine header.
#   cmake -DUI_DIR=<source>/ui -P check_ui_includes.cmake
if(NOT UI_DIR OR NOT IS_DIRECTORY "${UI_DIR}")
  message(FATAL_ERROR "check_ui_includes: UI_DIR is not a directory: '${UI_DIR}'")
endif()

file(GLOB_RECURSE files LIST_DIRECTORIES false "${UI_DIR}/*.h" "${UI_DIR}/*.hpp" "${UI_DIR}/*.cpp"
     "${UI_DIR}/*.cc")
list(SORT files)
if(NOT files)
  message(FATAL_ERROR "check_ui_includes: no sources under ${UI_DIR}")
endif()

set(violations "")
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include")
  file(READ "${f}" content)
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      set(header "${CMAKE_MATCH_1}")
      # Any spelling that reaches the engine tree: engine/x.h, ../engine/x.h, ./engine/x.h.
      if(header MATCHES "(^|/)engine/(.*)$")
        set(rest "${CMAKE_MATCH_2}")
        if(NOT header MATCHES "^engine/" OR NOT rest MATCHES "^(api|core)/[^/]+$")
          # Line number: newlines before the line's first occurrence, plus one.
          string(FIND "${content}" "${line}" offset)
          string(SUBSTRING "${content}" 0 ${offset} before)
          string(REGEX MATCHALL "\n" newlines "${before}")
          list(LENGTH newlines lineno)
          math(EXPR lineno "${lineno} + 1")
          file(RELATIVE_PATH rel "${UI_DIR}/.." "${f}")
          list(APPEND violations "${rel}:${lineno}: includes ${header}")
        endif()
      endif()
    endif()
  endforeach()
endforeach()

list(LENGTH files count)
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "UI files that include engine headers other than engine/api/* and "
                      "engine/core/* (go through a facade in engine/api):\n  ${text}")
endif()
message(STATUS "${count} UI files include only engine/api/* and engine/core/*")
