# test_live runs rp-generate (through RP_BIN_DIR): build it first.
if(TARGET test_live)
  add_dependencies(test_live rp-generate)
endif()
