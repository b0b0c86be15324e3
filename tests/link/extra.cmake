# The tools do not link the CUDA libraries (tests/link/check_tools.sh); run after every tool is built.
add_test(NAME Tools.LinkNoCudaLibraries COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_tools.sh ${CMAKE_BINARY_DIR}/bin ${RP_SHARED_DIR})
