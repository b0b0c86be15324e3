// Kernel scratch: memory a CPU kernel needs only while it runs (attention's kept dS blocks, the LM head's logit
// tiles, a GEMM's packed operand, the MoE's gathered rows), planned with the graph's tensors, so that the memory
// plan of a device or of the host counts it and a training step allocates none of it (ggml's work buffer, per
// node here).
//
//   node_scratch_bytes(n)   what node n's kernel takes (0 for most ops): each op family registers the size of
//                           its kernels' scratch beside the kernels (RegisterScratch), from the same function
//                           the kernel sizes its Scratch with;
//   plan_cpu_graph(g)       plan_graph (64-byte alignment) with the largest node's scratch after the tensors
//                           (the nodes run one after the other: one block serves them all);
//   ScratchBinding          CpuBackend::compute binds that block to its thread while the graph's nodes run;
//   Scratch                 a kernel's scratch, taken from the bound block as from a stack (a kernel's own
//                           arrays, then the GEMM it calls packing its operand: gemm.h), given back when it
//                           goes; where the block has no room left, a heap block of its own (as for a kernel
//                           called outside a planned graph: tests, benchmarks; unplanned_scratch_calls() counts
//                           the calls that ran bound and did not fit).
#pragma once

#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <unordered_set>
#include <utility>

namespace rp::cpu {

using ScratchBytes = size_t (*)(const Tensor * node);

struct RegisterScratch {
    RegisterScratch(std::initializer_list<std::pair<Op, ScratchBytes>> entries);
};

inline constexpr size_t kScratchAlign = 64;
inline constexpr size_t scratch_round(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// The bytes node n's kernel takes from its scratch (0: none, or no size registered for its op).
size_t node_scratch_bytes(const Tensor * n);

// plan_graph(g, 64, placed), then the largest node's scratch at its end (plan.scratch_offset / scratch_bytes).
AllocPlan plan_cpu_graph(const Graph & g, const std::unordered_set<const Tensor *> * placed = nullptr);

// Binds [base, base + bytes) as the scratch of the kernels this thread runs until it is destroyed (nested
// bindings restore the outer one).
class ScratchBinding {
public:
    ScratchBinding(void * base, size_t bytes);
    ~ScratchBinding();
    ScratchBinding(const ScratchBinding &) = delete;
    ScratchBinding & operator=(const ScratchBinding &) = delete;

private:
    void * prev_base_;
    size_t prev_bytes_, prev_top_;
};

// One kernel call's scratch of `bytes`, carved into arrays with take() (each 64-byte aligned: ask for the sum
// of scratch_round of each array's bytes). Scratches of one thread go in the reverse order of their making (they
// are scoped). Throws rp::Error when a heap block cannot be had.
class Scratch {
public:
    explicit Scratch(size_t bytes);
    ~Scratch();
    Scratch(const Scratch &) = delete;
    Scratch & operator=(const Scratch &) = delete;
    // The next n values (uninitialised); throws rp::Error past the bytes asked for (a programming error).
    template <class T>
    T * take(size_t n) {
        return static_cast<T *>(take_bytes(n * sizeof(T)));
    }
    bool planned() const { return bound_; }  // from the bound block

private:
    void * take_bytes(size_t bytes);
    struct FreeAligned {
        void operator()(char * p) const;
    };
    char * base_ = nullptr;
    size_t bytes_ = 0, used_ = 0;
    bool bound_ = false;
    size_t top_before_ = 0;  // the bound block's top when this took its part (restored when it goes)
    std::unique_ptr<char, FreeAligned> own_;
};

// Kernel calls (since the start of the process) whose scratch came from the bound block, and those that ran
// with a block bound but found too little of it left: a size the planner underestimates (the op tests assert
// there are none).
int64_t planned_scratch_calls();
int64_t unplanned_scratch_calls();

} // namespace rp::cpu
