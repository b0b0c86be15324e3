# rp-tokenize-oracle: llama.cpp's tokenizer (prebuilt libllama) for test_oracle_diff.cpp. Built only when
# tests/oracle/extra.cmake (included before this file) found the oracle libraries; otherwise that test skips
# locally and fails in CI, like every oracle test.
if(RP_ORACLE_FOUND AND TARGET rp_oracle_llama_v0_4_0 AND TARGET test_tokenizer)
  add_executable(rp-tokenize-oracle ${CMAKE_CURRENT_LIST_DIR}/oracle/tokenize_oracle.cpp)
  set_target_properties(rp-tokenize-oracle PROPERTIES
    CXX_STANDARD 17
    RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin"
    BUILD_RPATH "${RP_ORACLE_DIR}/bins"
    INSTALL_RPATH "${RP_ORACLE_DIR}/bins")
  # Third-party headers as system headers; no rp_flags (no sanitizer around the unsanitized libllama).
  target_include_directories(rp-tokenize-oracle SYSTEM PRIVATE "${RP_ORACLE_DIR}/llama.cpp/include"
                             "${RP_ORACLE_DIR}/llama.cpp/ggml/include")
  target_compile_options(rp-tokenize-oracle PRIVATE -Wall -Wextra -Wshadow=local $<$<BOOL:${RP_WERROR}>:-Werror>)
  target_link_libraries(rp-tokenize-oracle PRIVATE rp_oracle_llama_v0_4_0 rp_oracle_ggml_v0_4_0 rp_oracle_ggml-base)
  target_compile_definitions(test_tokenizer PRIVATE
    RP_TOK_ORACLE_BIN="${CMAKE_BINARY_DIR}/bin/rp-tokenize-oracle" RP_TOK_ORACLE_BINS="${RP_ORACLE_DIR}/bins")
  add_dependencies(test_tokenizer rp-tokenize-oracle)
endif()
