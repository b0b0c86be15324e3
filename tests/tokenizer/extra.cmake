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

# rp-chat-oracle: llama.cpp's chat-template rendering (libllama-common) for test_chat_oracle.cpp. Needs the
# common/ headers and models/templates/ that scripts/fetch-oracle.sh checks out next to include/.
if(RP_ORACLE_FOUND AND TARGET test_tokenizer AND EXISTS "${RP_ORACLE_DIR}/bins/libllama-common.so"
   AND EXISTS "${RP_ORACLE_DIR}/llama.cpp/common/chat.h" AND EXISTS "${RP_ORACLE_DIR}/llama.cpp/models/templates")
  if(NOT TARGET rp_oracle_llama_common)
    add_library(rp_oracle_llama_common SHARED IMPORTED)
    set_target_properties(rp_oracle_llama_common PROPERTIES IMPORTED_LOCATION "${RP_ORACLE_DIR}/bins/libllama-common.so")
  endif()
  add_executable(rp-chat-oracle ${CMAKE_CURRENT_LIST_DIR}/oracle/chat_oracle.cpp)
  set_target_properties(rp-chat-oracle PROPERTIES
    CXX_STANDARD 17
    RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin"
    BUILD_RPATH "${RP_ORACLE_DIR}/bins"
    INSTALL_RPATH "${RP_ORACLE_DIR}/bins")
  target_include_directories(rp-chat-oracle SYSTEM PRIVATE "${RP_ORACLE_DIR}/llama.cpp/common"
                             "${RP_ORACLE_DIR}/llama.cpp/include" "${RP_ORACLE_DIR}/llama.cpp/ggml/include")
  target_compile_options(rp-chat-oracle PRIVATE -Wall -Wextra -Wshadow=local $<$<BOOL:${RP_WERROR}>:-Werror>)
  target_link_libraries(rp-chat-oracle PRIVATE rp_oracle_llama_common rp_oracle_llama_v0_4_0 rp_oracle_ggml_v0_4_0
                        rp_oracle_ggml-base)
  target_compile_definitions(test_tokenizer PRIVATE
    RP_CHAT_ORACLE_BIN="${CMAKE_BINARY_DIR}/bin/rp-chat-oracle"
    RP_CHAT_TEMPLATES_DIR="${RP_ORACLE_DIR}/llama.cpp/models/templates")
  add_dependencies(test_tokenizer rp-chat-oracle)
endif()

# tokenizers.js (npm @huggingface/tokenizers, which scripts/fetch-oracle.sh unpacks into RP_ORACLE_DIR/hf-tokenizers)
# run by Node.js: the peer that reads the tokenizer.json we export (test_hf_tokenizer.cpp). Without them that test
# skips locally and fails in CI, like the oracle tests.
find_program(RP_NODE_EXECUTABLE node)
if(TARGET test_tokenizer AND RP_NODE_EXECUTABLE AND EXISTS "${RP_ORACLE_DIR}/hf-tokenizers/dist/tokenizers.mjs")
  target_compile_definitions(test_tokenizer PRIVATE
    RP_NODE_BIN="${RP_NODE_EXECUTABLE}"
    RP_HF_TOKENIZERS_MJS="${RP_ORACLE_DIR}/hf-tokenizers/dist/tokenizers.mjs"
    RP_HF_TOKENIZE_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/hf/hf_tokenize.mjs")
endif()
