td_add_test(test_isa SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_isa.cpp LABELS unit train
            LIBS traindeck_backend)
# Again with the generic level forced, as a user on a suspect CPU would run.
add_test(NAME test_isa_generic COMMAND test_isa activeLevelFollowsEnvironment)
set_tests_properties(test_isa_generic PROPERTIES LABELS "unit;train"
                     ENVIRONMENT "QT_QPA_PLATFORM=offscreen;TRAINDECK_ISA=generic")
