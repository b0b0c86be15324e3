// How the CPU backend runs one node: each op family's file (cpu/<family>.cpp) defines the kernel of every op
// it implements and registers it here by op, at namespace scope:
//
//   const RegisterKernels kRegister{{Op::ADD, add}, {Op::MUL, mul}};
//
// compute_node (cpu/backend.h) looks the kernel up, so nothing lists the kernels: adding an op means its row in
// core/ops.def and its own files. A kernel reads its sources through their strides and writes its node's
// memory (node->nb).
//
// Registrations are static objects of the family files, so the CPU library is linked whole
// (ggml_rp/CMakeLists.txt) and none is dropped; tests/ops/test_op_table.cpp checks that every op that computes
// has a kernel.
#pragma once

#include "ggml_rp/core/tensor.h"

#include <initializer_list>
#include <utility>

namespace rp::cpu {

using Kernel = void (*)(Tensor * node);

// The kernel registered for op, or nullptr (NONE and VIEW compute nothing and have none).
Kernel kernel_for(Op op);

struct RegisterKernels {
    RegisterKernels(std::initializer_list<std::pair<Op, Kernel>> entries);
};

} // namespace rp::cpu
