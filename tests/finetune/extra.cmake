# The kill -9 sweep (tests/finetune/kill_sweep.sh): 12 kills over a 30-step run, host and 3 devices sync and
# async, every third one inside a checkpoint write; each resumes to the uninterrupted run's bytes.
add_test(NAME FinetuneKill.Sweep COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/kill_sweep.sh ${CMAKE_BINARY_DIR} 12 7)
set_tests_properties(FinetuneKill.Sweep PROPERTIES ENVIRONMENT "RP_SHARED_DIR=${RP_SHARED_DIR}")
