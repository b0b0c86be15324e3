// The memory rules of a backend's runner without a device of it, for planning (FootprintRunner,
// runtime/graph_runner.h): a plan for CUDA devices is made, and checked, on any machine. Here, above the
// runtime, because the CUDA rules are the CUDA backend's own host-side ones (cuda/backend_plan.h, header-only:
// no CUDA library needed).
#pragma once

#include "ggml_rp/runtime/graph_runner.h"

#include <memory>
#include <string>

namespace rp {

// "cpu" (CpuGraphRunner's) or "cuda" (the CUDA runner's); rp::Error naming the backend otherwise.
std::unique_ptr<GraphRunner> footprint_rules(const std::string & backend);

} // namespace rp
