// The CUDA device (cuda_device.h): the Device interface on the CUDA runtime. The structure follows the CPU
// virtual device (runtime/cpu_device.cpp): an Impl holding the arena, one Stream object per role, sticky
// per-stream errors; CUDA itself provides the queues, the ordering and the event semantics.
#include "ggml_rp/cuda/cuda_device.h"

#include "base/error.h"
#include "ggml_rp/cuda/blas.cuh"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/cuda_runner.h"
#include "ggml_rp/cuda/logical_devices.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/runtime/mapped_arena.h"

#include <cuda_runtime.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <set>

namespace rp {

namespace {

// The failure of a call as rp::Error "<who>: <call>: <CUDA's message>", the thread's last error cleared
// (common.cuh's error model: a launch check must only ever see its own launch).
Error failure(cudaError_t e, const std::string & who, const char * call) {
    cuda::clear_last_error(e);
    return Error(std::string(who).append(": ").append(call).append(": ").append(cudaGetErrorString(e)));
}

// Throws failure(...) for a failed call.
void check(cudaError_t e, const std::string & who, const char * call) {
    if (e != cudaSuccess) throw failure(e, who, call);
}

// Makes `ordinal` the calling thread's current GPU for the scope, restoring the previous one afterwards.
class GpuScope {
public:
    GpuScope(int ordinal, const std::string & who) : ordinal_(ordinal) {
        check(cudaGetDevice(&prev_), who, "cudaGetDevice");
        if (prev_ != ordinal_) check(cudaSetDevice(ordinal_), who, "cudaSetDevice");
    }
    ~GpuScope() {
        if (prev_ != ordinal_) cudaSetDevice(prev_);  // best effort: a destructor must not throw
    }
    GpuScope(const GpuScope &) = delete;
    GpuScope & operator=(const GpuScope &) = delete;

private:
    int ordinal_;
    int prev_ = -1;
};

class CudaEvent final : public Event {
public:
    CudaEvent(int ordinal, std::string device) : ordinal_(ordinal), device_(std::move(device)) {
        GpuScope gpu(ordinal_, device_);
        check(cudaEventCreateWithFlags(&ev_, cudaEventDefault), device_, "cudaEventCreateWithFlags");
    }
    ~CudaEvent() override {
        if (ev_) cudaEventDestroy(ev_);  // CUDA defers the release until a pending record completes
    }
    CudaEvent(const CudaEvent &) = delete;
    CudaEvent & operator=(const CudaEvent &) = delete;

    int ordinal() const { return ordinal_; }
    const std::string & device() const { return device_; }
    cudaEvent_t handle() const { return ev_; }
    void mark_recorded() { recorded_.store(true); }

    bool query() override {
        GpuScope gpu(ordinal_, device_);
        // An unrecorded event reports success, as device.h says; cudaErrorNotReady is an answer, not a failure.
        return cuda::query_ready(cudaEventQuery(ev_), (device_ + ": cudaEventQuery").c_str());
    }

    void synchronize() override {
        GpuScope gpu(ordinal_, device_);
        check(cudaEventSynchronize(ev_), device_, "cudaEventSynchronize");
    }

    double elapsed_ms(Event & start) override {
        auto * other = dynamic_cast<CudaEvent *>(&start);
        if (!other) throw Error(device_ + ": elapsed_ms: the start event belongs to another device kind");
        if (!recorded_.load() || !other->recorded_.load()) throw Error(device_ + ": elapsed_ms: an event was never recorded");
        GpuScope gpu(ordinal_, device_);
        float ms = 0;
        const cudaError_t e = cudaEventElapsedTime(&ms, other->ev_, ev_);
        if (e == cudaErrorNotReady) {
            cuda::clear_last_error(e);  // not sticky; do not leave it for the next launch check
            throw Error(device_ + ": elapsed_ms: an event has not completed yet");
        }
        check(e, device_, "cudaEventElapsedTime");
        return static_cast<double>(ms);
    }

private:
    int ordinal_;
    std::string device_;
    cudaEvent_t ev_ = nullptr;
    std::atomic<bool> recorded_{false};
};

CudaEvent & as_cuda_event(Event & ev, const std::string & device) {
    auto * ce = dynamic_cast<CudaEvent *>(&ev);
    if (!ce) throw Error(device + ": an event of another device kind cannot be used with a CUDA device");
    return *ce;
}

} // namespace

struct CudaDevice::Impl {
    int index;
    int ordinal;
    std::string name;
    OpHook hook;

    MappedArena & mem;


    Impl(int idx, int ord, std::string nm, OpHook h, MappedArena & m)
        : index(idx), ordinal(ord), name(std::move(nm)), hook(std::move(h)), mem(m) {}

};

namespace {

class CudaStream final : public Stream {
public:
    CudaStream(CudaDevice::Impl & dev, int index) : dev_(dev), index_(index) {
        GpuScope gpu(dev_.ordinal, dev_.name);
        check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), dev_.name, "cudaStreamCreateWithFlags");
    }
    ~CudaStream() override {
        if (!s_) return;
        cudaSetDevice(dev_.ordinal);
        cudaStreamSynchronize(s_);  // pending host callbacks point at this object
        cuda::blas_release(s_);
        cudaStreamDestroy(s_);
    }
    CudaStream(const CudaStream &) = delete;
    CudaStream & operator=(const CudaStream &) = delete;

    int device_index() const override { return dev_.index; }
    int index() const override { return index_; }
    void * native_handle() override { return s_; }

    // The error model of a stream (the CPU virtual device's): a failed launch, copy, record or wait poisons
    // the stream; later launches and copies are skipped (records and waits still run, so that events keep
    // completing and nobody waits forever), and synchronize() rethrows the first error. Only bad arguments
    // (an event of another GPU, a copy outside the arena) throw at once.
    void launch(OpLabel label, std::function<void()> work) override {
        if (poisoned()) return;
        GpuScope gpu(dev_.ordinal, dev_.name);
        const std::string what = "kernel launch of '" + label.name + "'";
        Timing * t = begin_timing(std::move(label), 0);
        try {
            work();
            const cudaError_t e = cudaGetLastError();  // a raw kernel launch inside work that nobody checked
            check(e, where(), what.c_str());
        } catch (...) {
            poison(std::current_exception());
        }
        end_timing(t);
    }

    void copy(void * dst, const void * src, size_t bytes, CopyKind kind, OpLabel label) override {
        dev_.mem.check_copy(dst, src, bytes, kind, label.name);
        if (poisoned()) return;
        GpuScope gpu(dev_.ordinal, dev_.name);
        const std::string what = "cudaMemcpyAsync of '" + label.name + "' (" + std::to_string(bytes) + " bytes)";
        Timing * t = begin_timing(std::move(label), bytes);
        if (bytes > 0) {
            cudaMemcpyKind k = cudaMemcpyHostToHost;
            switch (kind) {
            case CopyKind::HostToDevice: k = cudaMemcpyHostToDevice; break;
            case CopyKind::DeviceToHost: k = cudaMemcpyDeviceToHost; break;
            case CopyKind::DeviceToDevice: k = cudaMemcpyDeviceToDevice; break;
            case CopyKind::HostToHost: k = cudaMemcpyHostToHost; break;
            }
            const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, s_);
            if (e != cudaSuccess) poison(std::make_exception_ptr(failure(e, where(), what.c_str())));
        }
        end_timing(t);
    }

    void record(Event & ev) override {
        CudaEvent & ce = as_cuda_event(ev, dev_.name);
        if (ce.ordinal() != dev_.ordinal) {
            throw Error(dev_.name + ": cannot record an event of " + ce.device() + " (GPU " + std::to_string(ce.ordinal()) +
                        ") on a stream of GPU " + std::to_string(dev_.ordinal) + "; wait on it instead");
        }
        GpuScope gpu(dev_.ordinal, dev_.name);
        const cudaError_t e = cudaEventRecord(ce.handle(), s_);
        if (e != cudaSuccess) {
            poison(std::make_exception_ptr(failure(e, where(), "cudaEventRecord")));
            return;
        }
        ce.mark_recorded();
    }

    void wait(Event & ev) override {
        CudaEvent & ce = as_cuda_event(ev, dev_.name);
        GpuScope gpu(dev_.ordinal, dev_.name);
        const cudaError_t e = cudaStreamWaitEvent(s_, ce.handle(), 0);
        if (e != cudaSuccess) poison(std::make_exception_ptr(failure(e, where(), "cudaStreamWaitEvent")));
    }

    void synchronize() override {
        cudaError_t e = cudaSuccess;
        {
            GpuScope gpu(dev_.ordinal, dev_.name);
            e = cudaStreamSynchronize(s_);
        }
        {
            std::lock_guard<std::mutex> lk(m_);
            if (error_) std::rethrow_exception(error_);
        }
        check(e, where(), "cudaStreamSynchronize");
    }

private:
    // One bracketed operation of the hook: stamped by two host callbacks, owned by the second.
    struct Timing {
        CudaStream * stream;
        OpRecord rec;
    };

    static void CUDART_CB on_start(void * p) { static_cast<Timing *>(p)->rec.start_us = clock_us(); }

    static void CUDART_CB on_end(void * p) {
        Timing * t = static_cast<Timing *>(p);
        t->rec.end_us = clock_us();
        try {
            t->stream->dev_.hook(t->rec);
        } catch (...) {
            t->stream->poison(std::current_exception());  // a callback must not throw into CUDA
        }
        delete t;
    }

    std::string where() const { return dev_.name + " stream " + stream_name(index_); }

    // nullptr when there is no hook (or its callback could not be enqueued: the stream is then poisoned).
    Timing * begin_timing(OpLabel label, size_t bytes) {
        if (!dev_.hook) return nullptr;
        auto * t = new Timing{this, {}};
        t->rec.device = dev_.index;
        t->rec.stream = index_;
        t->rec.name = std::move(label.name);
        t->rec.cat = std::move(label.cat);
        t->rec.bytes = bytes;
        const cudaError_t e = cudaLaunchHostFunc(s_, on_start, t);
        if (e != cudaSuccess) {
            delete t;
            poison(std::make_exception_ptr(failure(e, where(), "cudaLaunchHostFunc")));
            return nullptr;
        }
        return t;
    }

    void end_timing(Timing * t) {
        if (!t) return;
        const cudaError_t e = cudaLaunchHostFunc(s_, on_end, t);
        // on_start may still run and write to t: leak it rather than free memory a callback touches
        if (e != cudaSuccess) poison(std::make_exception_ptr(failure(e, where(), "cudaLaunchHostFunc")));
    }

    bool poisoned() {
        std::lock_guard<std::mutex> lk(m_);
        return error_ != nullptr;
    }

    void poison(std::exception_ptr e) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::move(e);
    }

    CudaDevice::Impl & dev_;
    int index_;
    cudaStream_t s_ = nullptr;
    std::mutex m_;
    std::exception_ptr error_;
};

} // namespace

namespace {

std::string checked_name(int index, const CudaDeviceOptions & options) {
    const std::string name = options.name.empty() ? cuda::logical_device_name(index) : options.name;
    if (options.num_streams < kNumStreamKinds) {
        throw Error(name + ": " + std::to_string(options.num_streams) + " streams requested, at least " +
                    std::to_string(kNumStreamKinds) + " are needed");
    }
    const int count = cuda_device_count();
    if (options.ordinal < 0 || options.ordinal >= count) {
        throw Error(name + ": GPU " + std::to_string(options.ordinal) + " does not exist (" + std::to_string(count) +
                    " visible)");
    }
    return name;
}

} // namespace

CudaDevice::CudaDevice(int index, CudaDeviceOptions options)
    : ArenaDevice(index, checked_name(index, options), options.memory_bytes), ordinal_(options.ordinal) {
    const std::string name_ = name();  // for the messages below
    const bool tf32 = options.tf32_gemm;
    impl_ = std::make_unique<Impl>(index, ordinal_, name_, std::move(options.hook), memory());
    GpuScope gpu(ordinal_, name_);
    if (impl_->mem.capacity() > 0) {
        void * p = nullptr;
        const cudaError_t e = cudaMalloc(&p, impl_->mem.capacity());
        if (e != cudaSuccess) {
            cudaGetLastError();
            throw Error(std::string(name_).append(": cannot reserve ").append(format_bytes(impl_->mem.capacity()))
                            .append(" on GPU ").append(std::to_string(ordinal_)).append(": cudaMalloc: ")
                            .append(cudaGetErrorString(e)));
        }
        impl_->mem.set_base(static_cast<std::byte *>(p));
    }
    try {
        for (int i = 0; i < options.num_streams; ++i) streams_.push_back(std::make_unique<CudaStream>(*impl_, i));
        // The compute stream's cuBLAS handle and workspace now, before any work, with its f32 GEMM math (blas.cuh).
        cuda::blas_set_tf32(static_cast<cudaStream_t>(stream(StreamKind::Compute).native_handle()), tf32, name_.c_str());
        runner_ = make_cuda_graph_runner(*this);
    } catch (...) {
        release();
        if (impl_->mem.base()) cudaFree(impl_->mem.base());
        throw;
    }
}

CudaDevice::~CudaDevice() {
    release();  // the runner waits for its stream; each stream waits for its work
    if (impl_ && impl_->mem.base()) {
        cudaSetDevice(ordinal_);
        cudaFree(impl_->mem.base());
    }
}

std::unique_ptr<Event> CudaDevice::create_event() { return std::make_unique<CudaEvent>(ordinal_, name()); }

void * CudaDevice::alloc_pinned(size_t bytes) {
    GpuScope gpu(ordinal_, name());
    void * p = nullptr;
    check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), name(), "cudaHostAlloc");
    remember_pinned(p);
    return p;
}

void CudaDevice::free_pinned(void * ptr) {
    if (!ptr) return;
    forget_pinned(ptr);
    GpuScope gpu(ordinal_, name());
    check(cudaFreeHost(ptr), name(), "cudaFreeHost");
}

void CudaDevice::register_host(void * ptr, size_t bytes, bool read_only) {
    cuda::process_host_registry().add(index(), ptr, bytes, name(), [&] {
        GpuScope gpu(ordinal_, name());
        unsigned flags = cudaHostRegisterPortable;
        if (read_only) {
            int supported = 0;
            check(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, ordinal_), name(),
                  "cudaDeviceGetAttribute");
            if (!supported) throw Error(name() + ": this GPU cannot register read-only host memory (an mmap'd file)");
            flags |= cudaHostRegisterReadOnly;
        }
        check(cudaHostRegister(ptr, bytes, flags), name(), "cudaHostRegister");
    });
}

void CudaDevice::unregister_host(void * ptr) {
    cuda::process_host_registry().remove(index(), ptr, name(), [&] {
        GpuScope gpu(ordinal_, name());
        check(cudaHostUnregister(ptr), name(), "cudaHostUnregister");
    });
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver / no GPU: clear the error, report none
        return 0;
    }
    return n;
}

std::string describe_cuda_gpus() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return std::string("no GPU visible: ") + cudaGetErrorString(e);
    }
    std::string out;
    for (int o = 0; o < n; ++o) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, o) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        out += "GPU " + std::to_string(o) + ": " + prop.name + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
               ", " + format_bytes(prop.totalGlobalMem) + (o + 1 < n ? "\n" : "");
    }
    return n ? out : "no GPU visible";
}

std::vector<std::unique_ptr<CudaDevice>> make_cuda_devices(const std::vector<size_t> & caps, OpHook hook, bool tf32_gemm) {
    const int n_logical = static_cast<int>(caps.size());
    const int count = cuda_device_count();
    const std::vector<int> ordinals = cuda::logical_device_ordinals(n_logical, count);
    std::vector<cuda::GpuInfo> gpus(static_cast<size_t>(count));
    for (int o = 0; o < count; ++o) {
        const std::string who = "CUDA GPU " + std::to_string(o);
        cudaDeviceProp prop{};
        check(cudaGetDeviceProperties(&prop, o), who, "cudaGetDeviceProperties");
        gpus[static_cast<size_t>(o)].name = prop.name;
        gpus[static_cast<size_t>(o)].overhead_bytes = cuda::blas_workspace_bytes(prop.major);
        GpuScope gpu(o, who);
        size_t free_b = 0, total_b = 0;
        check(cudaMemGetInfo(&free_b, &total_b), who, "cudaMemGetInfo");
        gpus[static_cast<size_t>(o)].free_bytes = free_b;
    }
    const std::vector<size_t> mem = cuda::resolve_logical_memory(ordinals, caps, gpus);
    cuda::check_logical_memory(ordinals, mem, gpus);
    std::vector<std::unique_ptr<CudaDevice>> devs;
    for (int i = 0; i < n_logical; ++i) {
        CudaDeviceOptions o;
        o.ordinal = ordinals[static_cast<size_t>(i)];
        o.memory_bytes = mem[static_cast<size_t>(i)];
        o.hook = hook;
        o.tf32_gemm = tf32_gemm;
        devs.push_back(std::make_unique<CudaDevice>(i, std::move(o)));
    }
    return devs;
}

} // namespace rp
