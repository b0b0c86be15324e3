// The op table: one descriptor per op, made from the op list (core/ops.def, the only place that lists every
// op). Autodiff, the CUDA backend's host-side rules and the dumps read it; the kernels are not in it: they
// register by op from their own folders (cpu/kernel_registry.h, cuda/node_kernel.cuh).
//
//   name      what dumps, traces and error messages print ("MUL_MAT")
//   shape     the shape rule its builder enforces, in the notation of the family header
//   backward  the vector-Jacobian rule (declared in ops/<family>.h, defined beside the forward): appends the
//             gradient nodes of the node's sources; no_gradient for ops whose result does not depend on
//             differentiable inputs (FILL); nullptr for the backward ops themselves (differentiating them is
//             an error: no double backward)
//   cuda      what the CUDA backend (a plugin, loaded at run time) needs to know before it launches: whether
//             it has a kernel, which operands its kernels read packed (a strided one is packed into scratch
//             first), whether a strided output is computed packed and copied into place, and whether the
//             node reports ids or labels out of range through a device flag. Host-only data, so the CPU
//             tests check the CUDA backend's planning on any machine (cuda/backend_plan.h).
#pragma once

#include "ggml_rp/core/tensor.h"

#include <cstdint>

namespace rp {

class Backward;

struct CudaTraits {
    bool kernel = false;             // the CUDA backend runs this op
    uint8_t packed_sources = 0;      // bit i set: source i is read packed
    bool packs_output = false;       // a strided (in-place, view) output is computed packed, then copied
    bool reports_bad_index = false;  // an id or label out of range sets a device flag (checked after a sync)
};

using BackwardRule = void (*)(Backward & b, Tensor * node);

struct OpDesc {
    Op op;
    const char * name;
    const char * shape;
    BackwardRule backward;
    CudaTraits cuda;
};

// The descriptor of op (rp::Error for Op::COUNT or a value outside the enum).
const OpDesc & op_desc(Op op);

namespace rules {
// The backward rule of ops whose value carries no gradient to its sources (FILL reads only a shape).
void no_gradient(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
