#include "ggml_rp/cpu/kernel_scratch.h"

#include "ggml_rp/ops/op_registry.h"
#include "base/error.h"

#include <algorithm>
#include <atomic>
#include <new>
#include <string>

namespace rp::cpu {

namespace {

// The block bound to this thread, and how much of it the live Scratches of this thread hold (a stack).
thread_local void * t_base = nullptr;
thread_local size_t t_bytes = 0;
thread_local size_t t_top = 0;
std::atomic<int64_t> g_planned{0}, g_unplanned{0};

} // namespace

RegisterScratch::RegisterScratch(std::initializer_list<std::pair<Op, ScratchBytes>> entries) {
    OpRegistry<ScratchBytes>::get().add(entries, "CPU scratch");
}

size_t node_scratch_bytes(const Tensor * n) {
    const ScratchBytes f = OpRegistry<ScratchBytes>::get().find(n->op);
    return f ? scratch_round(f(n)) : 0;
}

AllocPlan plan_cpu_graph(const Graph & g, const std::unordered_set<const Tensor *> * placed) {
    AllocPlan plan = plan_graph(g, kScratchAlign, placed);
    size_t scratch = 0;
    for (const Tensor * n : g.nodes) scratch = std::max(scratch, node_scratch_bytes(n));
    if (scratch > 0) {
        plan.scratch_offset = scratch_round(plan.size);
        plan.scratch_bytes = scratch;
        plan.size = plan.scratch_offset + scratch;
    }
    return plan;
}

ScratchBinding::ScratchBinding(void * base, size_t bytes) : prev_base_(t_base), prev_bytes_(t_bytes), prev_top_(t_top) {
    t_base = bytes > 0 ? base : nullptr;
    t_bytes = t_base ? bytes : 0;
    t_top = 0;
}

ScratchBinding::~ScratchBinding() {
    t_base = prev_base_;
    t_bytes = prev_bytes_;
    t_top = prev_top_;
}

void Scratch::FreeAligned::operator()(char * p) const { ::operator delete(p, std::align_val_t(kScratchAlign)); }

Scratch::Scratch(size_t bytes) : bytes_(scratch_round(bytes)) {
    if (bytes_ == 0) return;
    if (t_base && bytes_ <= t_bytes - t_top) {
        base_ = static_cast<char *>(t_base) + t_top;
        top_before_ = t_top;
        t_top += bytes_;
        bound_ = true;
        g_planned.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    if (t_base) g_unplanned.fetch_add(1, std::memory_order_relaxed);
    try {
        own_.reset(static_cast<char *>(::operator new(bytes_, std::align_val_t(kScratchAlign))));
    } catch (const std::bad_alloc &) {
        throw Error("kernel scratch: out of memory for " + std::to_string(bytes_) + " bytes");
    }
    base_ = own_.get();
}

Scratch::~Scratch() {
    if (bound_) t_top = top_before_;
}

void * Scratch::take_bytes(size_t bytes) {
    const size_t b = scratch_round(bytes);
    if (b > bytes_ - used_)
        throw Error("kernel scratch: " + std::to_string(b) + " bytes asked beside " + std::to_string(used_) + " taken of " +
                    std::to_string(bytes_) + " (the kernel's size function undercounts)");
    void * p = base_ + used_;
    used_ += b;
    return p;
}

int64_t planned_scratch_calls() { return g_planned.load(std::memory_order_relaxed); }
int64_t unplanned_scratch_calls() { return g_unplanned.load(std::memory_order_relaxed); }

} // namespace rp::cpu
