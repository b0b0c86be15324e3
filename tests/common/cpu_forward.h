// Computes `out` and everything it depends on with the CPU backend and returns its values: the reference the
// tests compare kernels, graphs and the oracle's logits with. Shared by every test program.
#pragma once

#include "ggml_rp/ggml_rp.h"

#include <vector>

namespace rp_test {

inline std::vector<float> forward_on_cpu(rp::Tensor * out) {
    rp::Graph g;
    rp::build_forward(g, out);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g);
    return rp::tensor_get_f32(out);
}

} // namespace rp_test
