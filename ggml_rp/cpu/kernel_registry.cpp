#include "ggml_rp/cpu/kernel_registry.h"

#include "ggml_rp/ops/op_registry.h"

namespace rp::cpu {

Kernel kernel_for(Op op) { return OpRegistry<Kernel>::get().find(op); }

RegisterKernels::RegisterKernels(std::initializer_list<std::pair<Op, Kernel>> entries) {
    OpRegistry<Kernel>::get().add(entries, "CPU");
}

} // namespace rp::cpu
