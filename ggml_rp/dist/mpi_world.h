// The MPI transport of the data-parallel collectives (communicator.h): Open MPI, launched by mpirun. The only
// file that includes <mpi.h> is mpi_world.cpp; a build without MPI (RP_MPI=OFF, or no libopenmpi-dev) still
// compiles this interface, and says so when asked for it.
//
//   MpiWorld::launched()   this process was started by mpirun / mpiexec (its environment says so), whether
//                          or not this build has MPI: a tool refuses to run R copies of a single-process job
//   MpiWorld::init()       MPI_Init_thread (MPI_THREAD_MULTIPLE: the optimizer thread and the caller's thread
//                          each talk on their own duplicate), and the world communicator
//   MpiWorld::finalize()   MPI_Finalize, after a run that ended well
//   MpiWorld::abort()      ends every rank of the job (after a PeerError: the peers may be blocked on us)
#pragma once

#include "ggml_rp/dist/communicator.h"

#include <memory>

namespace rp {

class MpiWorld {
public:
    static bool available();  // this build has MPI
    static bool launched();   // the environment of an mpirun-launched process (Open MPI, PMIx, Hydra)
    static int launched_size();  // the world size that environment names (1 when not launched)
    // Throws rp::Error when the build has no MPI, or MPI cannot give MPI_THREAD_MULTIPLE.
    static std::unique_ptr<Communicator> init(int * argc, char *** argv, const CommOptions & options);
    static void finalize();
    [[noreturn]] static void abort(int code);
};

} // namespace rp
