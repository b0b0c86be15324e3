# The MPI tests launch ranks with the mpirun CMake found; each test runs several short mpirun jobs.
if(TARGET test_mpi)
  target_compile_definitions(test_mpi PRIVATE RP_MPIEXEC="${RP_MPIEXEC}")
endif()
