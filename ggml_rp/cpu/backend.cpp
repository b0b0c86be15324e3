#include "ggml_rp/cpu/backend.h"

#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/cpu/op_profile.h"
#include "ggml_rp/ops/op_table.h"
#include "ggml_rp/cpu/strided.h"
#include "base/error.h"

#include <atomic>
#include <chrono>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace rp {

void CpuBackend::FreeAligned::operator()(void * p) const { ::operator delete(p, std::align_val_t(64)); }

size_t CpuBackend::allocate(const Graph & g) {
    const AllocPlan plan = cpu::plan_cpu_graph(g);
    allocate(g, plan);
    return plan.size;
}

void CpuBackend::allocate(const Graph & g, const AllocPlan & plan) {
    apply_plan(g, plan, reserve(plan.size));
    scratch_offset_ = plan.scratch_offset;
    scratch_bytes_ = plan.scratch_bytes;
}

void * CpuBackend::reserve(size_t bytes) {
    scratch_offset_ = scratch_bytes_ = 0;
    if (bytes > capacity_) {
        buffer_.reset();  // first: the old and the new buffer are never both held
        capacity_ = 0;
        buffer_.reset(::operator new(bytes, std::align_val_t(64)));
        capacity_ = bytes;
    }
    return buffer_.get();
}

namespace {

// Sets OpenMP's thread count for the kernels and restores it afterwards (also on an exception).
class ThreadCountScope {
public:
    explicit ThreadCountScope(int n) {
#ifdef _OPENMP
        prev_ = omp_get_max_threads();
        if (n > 0) omp_set_num_threads(n);
#else
        (void) n;
#endif
    }
    ~ThreadCountScope() {
#ifdef _OPENMP
        omp_set_num_threads(prev_);
#endif
    }

private:
    int prev_ = 1;
};

} // namespace

void CpuBackend::compute(const Graph & g, int n_threads) {
    compute(g, n_threads, scratch_bytes_ ? static_cast<char *>(buffer_.get()) + scratch_offset_ : nullptr, scratch_bytes_);
}

void CpuBackend::compute(const Graph & g, int n_threads, void * scratch, size_t scratch_bytes) {
    for (const Tensor * t : g.leafs)
        if (!t->data) throw Error("compute: leaf " + describe(t) + " has no data");
    for (const Tensor * t : g.nodes)
        if (!t->is_view() && !t->data) throw Error("compute: node " + describe(t) + " has no memory (call allocate first)");
    resolve_views(g);
    ThreadCountScope threads(n_threads);
    const cpu::ScratchBinding bind(scratch, scratch_bytes);
    for (Tensor * t : g.nodes) cpu::compute_node(t);
}

namespace cpu {

namespace {
std::atomic<int64_t> g_min_parallel{16384};
} // namespace

void set_min_parallel_elements(int64_t n) { g_min_parallel.store(n < 0 ? 0 : n); }
int64_t min_parallel_elements() { return g_min_parallel.load(std::memory_order_relaxed); }

void compute_node(Tensor * n) {
    if (n->op == Op::NONE || n->op == Op::VIEW) return;
    const Kernel kernel = kernel_for(n->op);
    if (!kernel) throw Error(std::string("compute: no CPU kernel for op ") + op_name(n->op) + " (" + describe(n) + ")");
    if (!op_profiling()) {
        kernel(n);
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    kernel(n);
    add_op_time(n->op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

} // namespace cpu

} // namespace rp
