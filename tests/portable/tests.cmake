# The binaries run on an x86-64 CPU without AVX. Not registered for -DTRAINDECK_NATIVE=ON builds,
# which are for the build machine's CPU only.
if(NOT TRAINDECK_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  add_test(NAME portable_binary
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_portable.sh $<TARGET_FILE:traindeck>
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(portable_binary PROPERTIES LABELS "integration;cli" SKIP_RETURN_CODE 77
                       ENVIRONMENT "QT_QPA_PLATFORM=offscreen;OMP_NUM_THREADS=2")
endif()
