#include "ggml_rp/cpu/kernel_registry.h"

#include <array>
#include <cstdio>
#include <cstdlib>

namespace rp::cpu {

namespace {

// Built on first use, so a registration in any file's static initializer finds it constructed.
std::array<Kernel, static_cast<size_t>(Op::COUNT)> & kernel_table() {
    static std::array<Kernel, static_cast<size_t>(Op::COUNT)> table{};
    return table;
}

} // namespace

Kernel kernel_for(Op op) {
    const size_t i = static_cast<size_t>(op);
    return i < kernel_table().size() ? kernel_table()[i] : nullptr;
}

RegisterKernels::RegisterKernels(std::initializer_list<std::pair<Op, Kernel>> entries) {
    for (const auto & [op, fn] : entries) {
        const size_t i = static_cast<size_t>(op);
        // Programming errors, found before main runs: an op outside the enum, or two kernels for one op.
        if (i >= kernel_table().size() || kernel_table()[i]) {
            std::fprintf(stderr, "ggml-rp: CPU kernel registered twice or for no op (%s)\n", op_name(op));
            std::abort();
        }
        kernel_table()[i] = fn;
    }
}

} // namespace rp::cpu
