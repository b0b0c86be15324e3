# The tools do not link the CUDA libraries (tests/link/check_tools.sh); run after every tool is built.
add_test(NAME Tools.LinkNoCudaLibraries COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_tools.sh ${CMAKE_BINARY_DIR}/bin ${RP_SHARED_DIR})
# ggml_rp/'s layers and models/' rooms include only the ones below them (tests/link/check_layers.sh).
add_test(NAME Layers.IncludeOnlyTheLayersBelow COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_layers.sh ${CMAKE_SOURCE_DIR})
add_test(NAME Layers.CheckerRefusesUpwardIncludes COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_layers_refuses.sh)
