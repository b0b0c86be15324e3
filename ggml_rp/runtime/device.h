// The Device interface: what an accelerator looks like to the RoundPipe scheduler.
//
// It mirrors CUDA so that the CUDA device is a thin mapping and the CPU virtual device (cpu_device.h) can
// stand in for it in tests:
//
//   Device::allocate / free          cudaMalloc / cudaFree, but inside ONE bounded arena per device (so the
//                                    high-water mark is exact and an oversized request fails with a message)
//   Stream                           cudaStream_t: an in-order queue of work
//   Stream::launch(label, work)      kernels (see below)
//   Stream::copy(dst, src, n, kind)  cudaMemcpyAsync
//   Stream::record(ev) / wait(ev)    cudaEventRecord / cudaStreamWaitEvent (ev may belong to another device)
//   Event::query / synchronize       cudaEventQuery / cudaEventSynchronize / cudaEventElapsedTime
//   Device::alloc_pinned             cudaHostAlloc (portable);  register_host: cudaHostRegister
//   Device::runner                   the device's graph runner (graph_runner.h): how programs run graphs on it,
//                                    like a ggml device creating its backend; the device owns it
//
// Event semantics are CUDA's, and the scheduler's protocol depends on them (roundpipe.md §9.1):
//   - wait() and synchronize() refer to the most recent record() made BEFORE the call; later records do not
//     affect a wait already enqueued;
//   - waiting on (or querying, or synchronizing) an event that was never recorded is a no-op / "complete".
//     That is why every consumer first checks a host "started" flag set after the record.
//
// launch(): on the CPU device `work` runs on the stream's worker thread, in stream order. On an accelerator
// `work` is called on the enqueuing thread with the device and native stream current (native_handle()) and
// must only ENQUEUE device work (kernel launches); the stream then orders that work. Code that runs the same
// job on both therefore never reads device results on the host inside `work`.
//
// Every stream has a fixed role; a device has at least these four (roundpipe.md §3.1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace rp {

class GraphRunner;

enum class StreamKind : int {
    WeightUpload = 0,      // param_upstream: H2D of weights, accumulated grads, buffers
    ActivationUpload = 1,  // upstream: H2D of activations, checkpoints, output-grads, labels
    Compute = 2,           // all kernels
    Download = 3,          // downstream: every D2H
};
constexpr int kNumStreamKinds = 4;
// The trace row of a data-parallel rank's all-reduces (dist/communicator.h): not a device stream.
constexpr int kAllReduceStream = 8;

// "weight_upload", "activation_upload", "compute", "download"; "stream<i>" for extra streams.
std::string stream_name(int stream);

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice, HostToHost };

// How a stream operation appears in a trace: name (e.g. "F2 mb3") and category "<pass>/<stage>"
// (e.g. "fwd/F2", "fused/FB", "bwd/B4"); the timeline colours by category.
struct OpLabel {
    std::string name;
    std::string cat;
    OpLabel() = default;
    OpLabel(const char * n) : name(n) {}  // NOLINT: implicit on purpose, labels are written inline
    OpLabel(std::string n, std::string c = {}) : name(std::move(n)), cat(std::move(c)) {}
};

// One executed stream operation (a launch or a copy), reported to the device's hook when it ends.
// Times are rp::clock_us() (runtime/clock.h), the same clock for every device of the process.
struct OpRecord {
    int device = 0;
    int stream = 0;
    std::string name;
    std::string cat;
    double start_us = 0;
    double end_us = 0;
    size_t bytes = 0;  // copies only
};
// Called from the device's worker threads: it must be thread-safe (roundpipe/trace.h has a collector).
using OpHook = std::function<void(const OpRecord &)>;

class Event {
public:
    virtual ~Event() = default;
    // True when the most recent record has completed, or when the event was never recorded.
    virtual bool query() = 0;
    // Blocks the calling host thread until the most recent record has completed (returns at once if none).
    virtual void synchronize() = 0;
    // Milliseconds from the completion of `start`'s most recent record to this event's (cudaEventElapsedTime):
    // how the planner's per-layer times are measured. Throws rp::Error when either is unrecorded or pending.
    virtual double elapsed_ms(Event & start) = 0;
};

class Stream {
public:
    virtual ~Stream() = default;
    virtual int device_index() const = 0;
    virtual int index() const = 0;  // a StreamKind value, or >= kNumStreamKinds for extra streams

    virtual void launch(OpLabel label, std::function<void()> work) = 0;
    // Asynchronous copy of `bytes` bytes. Device pointers must come from this stream's device's allocate();
    // host pointers should be pinned (alloc_pinned / register_host) for the copy to be truly asynchronous.
    virtual void copy(void * dst, const void * src, size_t bytes, CopyKind kind, OpLabel label = {}) = 0;
    virtual void record(Event & ev) = 0;
    virtual void wait(Event & ev) = 0;  // ev may belong to any device of the same kind
    // Blocks until all work enqueued so far has completed; rethrows the first error a job raised.
    virtual void synchronize() = 0;
    virtual void * native_handle() { return nullptr; }  // cudaStream_t on the CUDA device
};

class Device {
public:
    virtual ~Device() = default;
    virtual int index() const = 0;
    virtual std::string name() const = 0;  // e.g. "cpu:2", "cuda:0"

    // ---- memory: one bounded arena per device ----
    virtual size_t capacity() const = 0;
    // Throws rp::Error naming the device, `what` and the bytes when the request does not fit.
    virtual void * allocate(size_t bytes, const std::string & what) = 0;
    virtual void free(void * ptr) = 0;  // host order: the caller proves with events that no stream still uses it
    virtual size_t used() const = 0;
    virtual size_t high_water() const = 0;  // peak of used() since creation or reset_high_water()
    virtual void reset_high_water() = 0;

    // ---- streams and events ----
    virtual int num_streams() const = 0;
    virtual Stream & stream(int i) = 0;
    Stream & stream(StreamKind kind) { return stream(static_cast<int>(kind)); }
    virtual std::unique_ptr<Event> create_event() = 0;
    virtual void synchronize() = 0;  // every stream; rethrows the first job error

    // ---- how graphs run here (runtime/graph_runner.h); owned by the device, used from its compute stream ----
    virtual GraphRunner & runner() = 0;

    // ---- page-locked host memory ----
    virtual void * alloc_pinned(size_t bytes) = 0;
    virtual void free_pinned(void * ptr) = 0;
    // Pins an existing range. read_only: the range may be mapped read-only (an mmap'd GGUF file): the device
    // only reads it (CUDA needs cudaHostRegisterReadOnly for such a mapping, or the registration fails).
    virtual void register_host(void * ptr, size_t bytes, bool read_only = false) = 0;
    virtual void unregister_host(void * ptr) = 0;
};

class PinnedPool;

// A pinned host allocation that frees itself -- or, taken from a PinnedPool (runtime/pinned_pool.h), goes back
// to the pool for the next taker.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    PinnedBuffer(Device & dev, size_t bytes) : dev_(&dev), ptr_(dev.alloc_pinned(bytes)), bytes_(bytes), capacity_(bytes) {}
    PinnedBuffer(PinnedBuffer && o) noexcept { *this = std::move(o); }
    PinnedBuffer & operator=(PinnedBuffer && o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_; ptr_ = o.ptr_; bytes_ = o.bytes_; capacity_ = o.capacity_; pool_ = std::move(o.pool_);
            o.dev_ = nullptr; o.ptr_ = nullptr; o.bytes_ = 0; o.capacity_ = 0;
        }
        return *this;
    }
    PinnedBuffer(const PinnedBuffer &) = delete;
    PinnedBuffer & operator=(const PinnedBuffer &) = delete;
    ~PinnedBuffer() { reset(); }

    void reset();
    void * data() const { return ptr_; }
    template <typename T> T * as() const { return static_cast<T *>(ptr_); }
    size_t size() const { return bytes_; }

private:
    friend class PinnedPool;
    Device * dev_ = nullptr;
    void * ptr_ = nullptr;
    size_t bytes_ = 0;     // what was asked for
    size_t capacity_ = 0;  // what the block holds (>= bytes_ when it came from a pool)
    std::shared_ptr<PinnedPool> pool_;
};

} // namespace rp
