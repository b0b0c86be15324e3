# test_gguf runs the rp-gguf program (RP_BIN_DIR/rp-gguf): build it whenever the test is built.
if(TARGET test_gguf AND TARGET rp-gguf)
  add_dependencies(test_gguf rp-gguf)
endif()
