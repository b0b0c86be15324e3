# The GPU check's preparation and its dry run (tests/gpu/check_gpu_prep.sh), on any machine.
add_test(NAME GpuPrep.CarryConfiguresAndDryRunWalksEveryPhase
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_gpu_prep.sh ${CMAKE_SOURCE_DIR} ${RP_SHARED_DIR})
set_tests_properties(GpuPrep.CarryConfiguresAndDryRunWalksEveryPhase PROPERTIES TIMEOUT 600)
