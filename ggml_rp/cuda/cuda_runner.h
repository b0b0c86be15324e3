// The graph runner of a CudaDevice (runtime/graph_runner.h): how the per-layer training programs run their
// graphs when the RoundPipe runtime launches them on a CUDA device. Everything is enqueued on the device's
// compute stream, from inside that stream's launch (runtime/device.h):
//   - graphs: CudaBackend::allocate + compute. The backends live as long as the runner, one per count of
//     bad-index-reporting nodes in a graph (CudaBackend sizes its workspace by that count and would reallocate
//     on every change), so their buffers are reused only in stream order. A backend frees its buffers before
//     growing them while kernels of earlier graphs may still be queued on them: the runner synchronizes the
//     compute stream first, which happens only while the graphs still grow (the first micro-batches);
//   - uploads (positions): a fresh block of the device's arena per upload, copied on the compute stream and
//     freed once a CUDA event recorded after the next graph has completed (checked on later calls, and all
//     at destruction). When the arena cannot serve a graph or an upload, the runner waits for the compute
//     stream, frees every finished upload and tries once more;
//   - copy_out / zero: cudaMemcpyAsync device-to-device / cudaMemsetAsync on the compute stream.
// The bad-index flags of CudaBackend (ids or labels out of range) are not read: the host checks ids and
// labels against the vocabulary before training (the dataset), and reading them would cost a synchronization.
// No CUDA header here: plain C++ (tools, tests) includes it.
#pragma once

#include "ggml_rp/runtime/graph_runner.h"

#include <memory>
#include <vector>

namespace rp {

class CudaDevice;

// The runner a CudaDevice owns (CudaDevice creates it; destroy it before the device's streams: its
// destructor waits for the compute stream).
std::unique_ptr<GraphRunner> make_cuda_graph_runner(CudaDevice & device);

} // namespace rp
