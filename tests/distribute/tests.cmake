# MpiCollectives between two processes under mpirun (check_mpi.sh, through mpi_launch.sh), one
# CTest entry per case. Without MPI in the build, or without mpirun, each reports SKIP (77) with
# the reason.
add_executable(test_mpi_collectives ${CMAKE_CURRENT_LIST_DIR}/test_mpi_collectives.cpp)
target_compile_options(test_mpi_collectives PRIVATE ${TRAINDECK_WARNINGS})
target_link_libraries(test_mpi_collectives PRIVATE traindeck_distribute)
if(TRAINDECK_HAVE_MPI)
  # The benchmark compares with MPI_Allreduce.
  target_link_libraries(test_mpi_collectives PRIVATE MPI::MPI_C)
  target_compile_definitions(test_mpi_collectives PRIVATE TRAINDECK_HAVE_MPI=1)
endif()
foreach(case reduce host hang abort kill)
  add_test(NAME mpi_collectives_${case}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_mpi.sh ${case}
                   $<TARGET_FILE:test_mpi_collectives>)
  # One MPI job at a time: two workers already fill a 2-core machine. The script bounds each
  # job's wall time itself (timeout), below CTest's.
  set_tests_properties(mpi_collectives_${case} PROPERTIES LABELS "integration;distribute"
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK mpi TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
# Three workers: two workers sum every bucket whole; more split it into chunks, each summed by its
# owner and sent back.
add_test(NAME mpi_collectives_reduce_3_workers
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_mpi.sh reduce $<TARGET_FILE:test_mpi_collectives> 3)
set_tests_properties(mpi_collectives_reduce_3_workers PROPERTIES LABELS "integration;distribute"
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK mpi TIMEOUT 300
                     ENVIRONMENT "OMP_NUM_THREADS=1")
# Launch detection and mpiWorld() without a launcher: the binary alone, in every build.
add_test(NAME mpi_launch_detection COMMAND test_mpi_collectives launch)
set_tests_properties(mpi_launch_detection PROPERTIES LABELS "unit;distribute")
