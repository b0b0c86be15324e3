# The option tables are the tools' (tools/*_options.cpp): the tests link them. The run-file tests run
# rp-finetune, and the help tests rp-gguf, rp-trace and rp-bench (RP_BIN_DIR): build them first.
target_link_libraries(test_tools PRIVATE rp_tool_options)
add_dependencies(test_tools rp-finetune rp-gguf rp-trace rp-bench)
