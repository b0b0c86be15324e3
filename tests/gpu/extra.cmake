# The GPU check's preparation and its dry run (tests/gpu/check_gpu_prep.sh), on any machine.
add_test(NAME GpuPrep.CarryConfiguresAndDryRunWalksEveryPhase
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_gpu_prep.sh ${CMAKE_SOURCE_DIR} ${RP_SHARED_DIR})
set_tests_properties(GpuPrep.CarryConfiguresAndDryRunWalksEveryPhase PROPERTIES TIMEOUT 600)


# The GPU check's transformers cross-check of our exports: the cases it reads, made here with the tools, and their
# tokenizer files read by tokenizers.js (scripts/fetch-oracle.sh; without Node.js or it the test skips, and fails in CI).
find_program(RP_NODE_EXECUTABLE node)
set(RP_ORACLE_DIR "${CMAKE_SOURCE_DIR}/.oracle" CACHE PATH "scripts/fetch-oracle.sh output: bins/ and llama.cpp/ headers")  # (tests/oracle's)
add_test(NAME GpuPrep.HfCasesAreMadeAndTheirTokenizersGiveOurIds
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_hf_cases.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bin ${RP_SHARED_DIR}
                 "${RP_NODE_EXECUTABLE}" ${RP_ORACLE_DIR}/hf-tokenizers/dist/tokenizers.mjs)
set_tests_properties(GpuPrep.HfCasesAreMadeAndTheirTokenizersGiveOurIds PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
