# The option tables are the tools' (tools/*_options.cpp): the tests link them.
target_link_libraries(test_tools PRIVATE rp_tool_options)
