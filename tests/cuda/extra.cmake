# The static kernel-resource checker's own test (no nvcc needed; CI runs the checker itself on the real kernels).
add_test(NAME CudaResources.CheckerRefusesKernelsThatDoNotFit COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_kernel_resources_test.sh)
