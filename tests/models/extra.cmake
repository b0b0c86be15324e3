# test_models runs rp-perplexity and rp-generate (through RP_BIN_DIR): build them first.
if(TARGET test_models)
  add_dependencies(test_models rp-perplexity rp-generate)
endif()
