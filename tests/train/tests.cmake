td_add_test(test_optim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim.cpp LABELS unit train LIBS traindeck_train)
td_add_test(test_optim_isa SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim_isa.cpp
            LABELS unit train LIBS traindeck_train)
# Again with the generic level forced, as a user on a suspect CPU would.
add_test(NAME test_optim_isa_generic COMMAND test_optim_isa activeLevelFollowsEnvironment)
set_tests_properties(test_optim_isa_generic PROPERTIES LABELS "unit;train"
                     ENVIRONMENT "QT_QPA_PLATFORM=offscreen;TRAINDECK_ISA=generic")
