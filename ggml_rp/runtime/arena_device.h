// What every Device implementation shares (runtime/device.h): one bounded arena mapped onto the device's
// memory (mapped_arena.h), the fixed set of streams, synchronizing all of them, and the device's graph runner.
// CpuDevice and CudaDevice derive from it and add only what differs: how memory is reserved, what a stream
// and an event are, pinned host memory.
#pragma once

#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/graph_runner.h"
#include "ggml_rp/runtime/mapped_arena.h"

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace rp {

class ArenaDevice : public Device {
public:
    ~ArenaDevice() override;

    int index() const override { return index_; }
    std::string name() const override { return name_; }

    size_t capacity() const override { return mem_.capacity(); }
    void * allocate(size_t bytes, const std::string & what) override { return mem_.allocate(bytes, what); }
    void free(void * ptr) override { mem_.free(ptr); }
    size_t used() const override { return mem_.used(); }
    size_t high_water() const override { return mem_.high_water(); }
    void reset_high_water() override { mem_.reset_high_water(); }
    size_t largest_free() const { return mem_.largest_free(); }
    // True when [ptr, ptr + bytes) lies inside this device's memory.
    bool contains(const void * ptr, size_t bytes) const { return mem_.contains(ptr, bytes); }

    int num_streams() const override { return static_cast<int>(streams_.size()); }
    Stream & stream(int i) override;
    using Device::stream;
    // Waits for every stream; rethrows the first error any of them met.
    void synchronize() override;

    GraphRunner & runner() override { return *runner_; }

protected:
    ArenaDevice(int index, std::string name, size_t capacity) : index_(index), name_(name), mem_(std::move(name), capacity) {}
    MappedArena & memory() { return mem_; }
    // The pinned blocks this device handed out, so free_pinned can refuse a foreign pointer (rp::Error).
    void remember_pinned(const void * p);
    void forget_pinned(const void * p);
    // The derived constructor creates the streams, then the runner (which may use them); the derived
    // destructor calls release() first, so both go while the derived device's state still exists.
    void release();

    std::vector<std::unique_ptr<Stream>> streams_;
    std::unique_ptr<GraphRunner> runner_;

private:
    int index_;
    std::string name_;
    MappedArena mem_;
    std::mutex pinned_m_;
    std::set<const void *> pinned_;
};

} // namespace rp
