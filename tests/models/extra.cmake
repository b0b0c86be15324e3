# test_models runs rp-perplexity, rp-generate and rp-gguf (through RP_BIN_DIR): build them first.
if(TARGET test_models)
  add_dependencies(test_models rp-perplexity rp-generate rp-gguf)
endif()
