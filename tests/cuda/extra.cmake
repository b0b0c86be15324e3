# rp-cuda-bench: GEMM and attention throughput on the GPU (tools/gpu-check.sh runs it). Built only with CUDA;
# a program of its own because bench/ (rp-bench) globs only .cpp files compiled without the CUDA headers.
if(RP_HAVE_CUDA)
  add_executable(rp-cuda-bench ${CMAKE_CURRENT_LIST_DIR}/bench/cuda_bench.cpp)
  target_link_libraries(rp-cuda-bench PRIVATE ggml_rp gguf)
  set_target_properties(rp-cuda-bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endif()

