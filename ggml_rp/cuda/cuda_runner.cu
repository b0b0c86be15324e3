// The CUDA graph runner (cuda_runner.h): CudaBackends reused in compute-stream order, uploads freed behind
// CUDA events.
#include "ggml_rp/cuda/cuda_runner.h"

#include "base/error.h"
#include "ggml_rp/core/alloc.h"
#include "ggml_rp/cuda/backend.h"
#include "ggml_rp/cuda/backend_plan.h"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/cuda_device.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

namespace rp {

namespace {

class CudaGraphRunner final : public GraphRunner {
public:
    explicit CudaGraphRunner(CudaDevice & dev) : dev_(dev), stream_(dev.stream(StreamKind::Compute)) {}

    ~CudaGraphRunner() override {
        // Nothing may still read the uploads or the backends' buffers when they go back to the arena.
        cudaSetDevice(dev_.ordinal());
        cudaStreamSynchronize(native());
        for (Retired & r : retired_) release(r);
        for (void * p : pending_) free_quietly(p);
        if (held_block_) free_quietly(held_);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    }
    CudaGraphRunner(const CudaGraphRunner &) = delete;
    CudaGraphRunner & operator=(const CudaGraphRunner &) = delete;

    size_t run(Graph & g, int /*n_threads: the GPU runs every node*/, const std::function<void()> & results) override {
        select();
        if (region_) {  // [held | uploads of this graph | the graph's buffer and workspace], reused in stream order
            const size_t at = cuda::align256(region_uploads_);
            if (at > region_bytes_) throw Error(dev_.name() + ": the uploads of a program overflow the graph region");
            if (!region_backend_) region_backend_ = std::make_unique<CudaBackend>(dev_);
            const size_t bytes = region_backend_->bind(g, static_cast<char *>(region_) + at, region_bytes_ - at);
            region_peak_ = std::max(region_peak_, at + cuda::cuda_graph_bytes(g).total());
            region_backend_->compute(g, stream_);
            if (results) results();
            region_uploads_ = held_bytes_;
            return bytes;
        }
        reclaim();
        size_t flags = 0, scratch = 0;
        for (const Tensor * n : g.nodes) {
            if (cuda::reports_bad_index(n->op)) ++flags;
            scratch = std::max(scratch, cuda::node_scratch_bytes(n));
        }
        std::unique_ptr<CudaBackend> & be = backends_[flags];
        if (!be) be = std::make_unique<CudaBackend>(dev_);
        // CudaBackend::allocate frees a buffer that is too small before taking a larger one; graphs enqueued
        // earlier may still use it, so wait for them (only while the graphs grow).
        const size_t ws_need = scratch + cuda::align256(flags * sizeof(int)) + cuda::align256(sizeof(double));
        const bool grows = (be->buffer_size() > 0 && plan_graph(g, 256).size > be->buffer_size()) ||
                           (be->workspace_size() > 0 && ws_need > be->workspace_size());
        if (grows) wait_stream();
        size_t bytes = 0;
        try {
            bytes = be->allocate(g);
        } catch (const Error &) {
            // The arena may be full of uploads whose graphs have run by now: free them, then try once more.
            wait_stream();
            reclaim();
            bytes = be->allocate(g);
        }
        be->compute(g, stream_);
        if (results) results();
        // The uploads this graph read are free once the stream has passed it.
        if (!pending_.empty()) {
            Retired r;
            r.event = take_event();
            r.blocks = std::move(pending_);
            pending_.clear();
            cuda::check(cudaEventRecord(r.event, native()), (dev_.name() + ": graph runner: cudaEventRecord").c_str());
            retired_.push_back(std::move(r));
        }
        return bytes;
    }

    void copy_out(void * dst, const Tensor * node) override {
        if (!dtype_is_float(node->type) || !node->is_contiguous())
            throw Error("cuda graph runner: copy_out of " + describe(node) + ": the node is not contiguous f32, f16 or bf16");
        select();
        cuda::check(cudaMemcpyAsync(dst, node->data, node->nbytes(),
                                    cudaMemcpyDeviceToDevice, native()),
                    (dev_.name() + ": graph runner: cudaMemcpyAsync of " + node->name).c_str());
    }

    void zero(void * dst, size_t bytes) override {
        select();
        cuda::check(cudaMemsetAsync(dst, 0, bytes, native()), (dev_.name() + ": graph runner: cudaMemsetAsync").c_str());
    }

    size_t graph_bytes(const Graph & g) const override { return cuda::cuda_graph_bytes(g).total(); }
    size_t upload_bytes(size_t bytes) const override { return cuda::align256(bytes); }
    size_t region_high_water() const override { return region_peak_; }

    void set_region(void * base, size_t bytes) override {
        if (held_) throw Error(dev_.name() + ": graph runner: set_region while a program holds memory");
        select();
        wait_stream();  // nothing may still use the previous memory
        region_ = base;
        region_bytes_ = base ? bytes : 0;
        region_uploads_ = 0;
        region_peak_ = 0;
    }

    void * upload(const void * host, size_t bytes) override {
        select();
        if (region_) {
            void * p = static_cast<char *>(region_) + region_uploads_;
            region_uploads_ += cuda::align256(bytes);
            if (region_uploads_ > region_bytes_) throw Error(dev_.name() + ": an upload overflows the graph region");
            // From pageable memory the copy is staged before the call returns: the caller may free `host` at once.
            cuda::check(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, native()),
                        (dev_.name() + ": graph runner: cudaMemcpyAsync of an upload").c_str());
            return p;
        }
        reclaim();
        void * p = nullptr;
        try {
            p = dev_.allocate(bytes, "graph input");
        } catch (const Error &) {
            wait_stream();  // as in run(): earlier uploads go back once their graphs have run
            reclaim();
            p = dev_.allocate(bytes, "graph input");
        }
        pending_.push_back(p);
        // From pageable memory the copy is staged before the call returns: the caller may free `host` at once.
        cuda::check(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, native()),
                    (dev_.name() + ": graph runner: cudaMemcpyAsync of an upload").c_str());
        return p;
    }

    void * hold(size_t bytes) override {
        select();
        if (held_) throw Error(dev_.name() + ": graph runner: hold() twice without release_held()");
        const size_t b = cuda::align256(bytes);
        if (region_) {  // the region's start: this program's uploads and graphs go after it
            if (region_uploads_ != 0) throw Error(dev_.name() + ": graph runner: hold() after an upload for the next graph");
            if (b > region_bytes_) throw Error(dev_.name() + ": memory held by a program overflows the graph region");
            held_ = region_;
            held_bytes_ = b;
            region_uploads_ = b;
            return held_;
        }
        reclaim();
        try {
            held_ = dev_.allocate(b, "program state");
        } catch (const Error &) {
            wait_stream();
            reclaim();
            held_ = dev_.allocate(b, "program state");
        }
        held_block_ = true;
        return held_;
    }

    void release_held() override {
        if (!held_) return;
        if (held_block_) {  // freed once the stream has passed the graphs that used it
            select();
            Retired r;
            r.event = take_event();
            r.blocks.push_back(held_);
            cuda::check(cudaEventRecord(r.event, native()), (dev_.name() + ": graph runner: cudaEventRecord").c_str());
            retired_.push_back(std::move(r));
        } else {
            region_uploads_ -= std::min(region_uploads_, held_bytes_);  // (0: no upload may be pending across a program's end)
        }
        held_ = nullptr;
        held_bytes_ = 0;
        held_block_ = false;
    }

private:
    struct Retired {
        cudaEvent_t event = nullptr;
        std::vector<void *> blocks;
    };

    cudaStream_t native() { return static_cast<cudaStream_t>(stream_.native_handle()); }
    void wait_stream() {
        cuda::check(cudaStreamSynchronize(native()), (dev_.name() + ": graph runner: cudaStreamSynchronize").c_str());
    }
    void select() { cuda::check(cudaSetDevice(dev_.ordinal()), (dev_.name() + ": cudaSetDevice").c_str()); }

    cudaEvent_t take_event() {
        if (!free_events_.empty()) {
            cudaEvent_t e = free_events_.back();
            free_events_.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), (dev_.name() + ": graph runner: cudaEventCreate").c_str());
        return e;
    }
    void free_quietly(void * p) {
        try { dev_.free(p); } catch (...) {}
    }
    void release(Retired & r) {
        for (void * p : r.blocks) free_quietly(p);
        r.blocks.clear();
        free_events_.push_back(r.event);
    }
    // Frees the uploads of graphs the stream has finished, oldest first (they complete in stream order).
    void reclaim() {
        while (!retired_.empty()) {
            if (!cuda::query_ready(cudaEventQuery(retired_.front().event), (dev_.name() + ": graph runner: cudaEventQuery").c_str()))
                return;
            release(retired_.front());
            retired_.pop_front();
        }
    }

    CudaDevice & dev_;
    Stream & stream_;
    void * region_ = nullptr;  // set_region: the memory plan's graph region
    size_t region_bytes_ = 0;
    size_t region_uploads_ = 0;  // bytes of uploads made for the next graph
    size_t region_peak_ = 0;
    void * held_ = nullptr;     // hold(): the region's first held_bytes_, or a block of the arena (held_block_)
    size_t held_bytes_ = 0;
    bool held_block_ = false;
    std::unique_ptr<CudaBackend> region_backend_;
    std::map<size_t, std::unique_ptr<CudaBackend>> backends_;  // by bad-index flag count
    std::vector<void *> pending_;                              // uploads of the graph being built
    std::deque<Retired> retired_;
    std::vector<cudaEvent_t> free_events_;
};

} // namespace

std::unique_ptr<GraphRunner> make_cuda_graph_runner(CudaDevice & device) { return std::make_unique<CudaGraphRunner>(device); }

} // namespace rp
