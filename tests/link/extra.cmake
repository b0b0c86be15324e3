# The tools do not link the CUDA libraries (tests/link/check_tools.sh); run after every tool is built.
add_test(NAME Tools.LinkNoCudaLibraries COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_tools.sh ${CMAKE_BINARY_DIR}/bin ${RP_SHARED_DIR})
# models/ rooms include only the rooms below them (tests/link/check_model_rooms.sh).
add_test(NAME Models.RoomsIncludeOnlyTheRoomsBelow COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_model_rooms.sh ${CMAKE_SOURCE_DIR})
add_test(NAME Models.RoomCheckerRefusesUpwardIncludes COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_model_rooms_refuses.sh)
