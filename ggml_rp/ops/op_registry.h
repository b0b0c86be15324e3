// A table of one entry per op that a backend's op families fill from static registration objects in their own
// files (cpu/kernel_registry.h, cuda/node_kernel.cuh), so no file lists a backend's kernels. Built on first
// use: a registration in any file's static initializer finds it constructed.
#pragma once

#include "ggml_rp/core/tensor.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <utility>

namespace rp {

template <class Entry>
class OpRegistry {
public:
    // The one registry of this entry type.
    static OpRegistry & get() {
        static OpRegistry registry;
        return registry;
    }
    // The entry registered for op, or nullptr.
    Entry find(Op op) const {
        const size_t i = static_cast<size_t>(op);
        return i < table_.size() ? table_[i] : nullptr;
    }
    // A programming error, found before main runs, aborts: an op outside the enum, or two entries for one op.
    void add(std::initializer_list<std::pair<Op, Entry>> entries, const char * backend) {
        for (const auto & [op, entry] : entries) {
            const size_t i = static_cast<size_t>(op);
            if (i >= table_.size() || table_[i]) {
                std::fprintf(stderr, "ggml-rp: %s kernel registered twice or for no op (%s)\n", backend, op_name(op));
                std::abort();
            }
            table_[i] = entry;
        }
    }

private:
    std::array<Entry, static_cast<size_t>(Op::COUNT)> table_{};
};

} // namespace rp
