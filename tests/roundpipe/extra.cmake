# The pipeline tests generate their models with the live tests' synthetic-model writer.
target_sources(test_roundpipe PRIVATE ${CMAKE_SOURCE_DIR}/tests/live/synth_model.cpp)
