// The CPU virtual device: a Device whose streams are worker threads, whose memory is a bounded arena over one
// host allocation and whose copies are memcpys, optionally slowed to a modelled link. N of them make the
// whole RoundPipe scheduler testable without a GPU (roundpipe.md §16):
//
// - one worker thread per stream executes that stream's queue in order; waits block on a condition
//   variable (no busy waiting); destruction finishes every queued item, then joins;
// - copies: H2D and D2H each go through their own link (PCIe is full duplex) with bandwidth and latency;
//   a copy reserves the link from max(now, link free) for latency + n / bandwidth, does the memcpy and then
//   sleeps out the remainder, so two streams uploading at once share the link one after the other;
// - delay injection (delay_seed != 0): before every queued item the worker sleeps a random
//   [0, max_delay_us] drawn from a per-stream generator seeded by (seed, device, stream), to shake out
//   missing events in race fuzzing;
// - hook: every executed launch and copy is reported (device, stream, label, start/end, bytes);
// - a job that throws poisons its stream (CUDA's sticky error): later launches and copies of that stream
//   are skipped, records still complete (so no other stream dead-locks) and synchronize() rethrows.
#pragma once

#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/link_model.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rp {

struct CpuDeviceOptions {
    size_t memory_bytes = size_t(64) << 20;
    int num_streams = kNumStreamKinds;  // at least kNumStreamKinds
    std::optional<LinkModel> link;      // H2D and D2H links; none = memcpy speed
    uint64_t delay_seed = 0;            // 0 = no delay injection
    double max_delay_us = 0;
    OpHook hook;                        // may be empty
    std::string name;                   // default "cpu:<index>"
};

class CpuDevice final : public Device {
public:
    CpuDevice(int index, CpuDeviceOptions options = {});
    ~CpuDevice() override;
    CpuDevice(const CpuDevice &) = delete;
    CpuDevice & operator=(const CpuDevice &) = delete;

    int index() const override { return index_; }
    std::string name() const override { return name_; }

    size_t capacity() const override;
    void * allocate(size_t bytes, const std::string & what) override;
    void free(void * ptr) override;
    size_t used() const override;
    size_t high_water() const override;
    void reset_high_water() override;
    size_t largest_free() const;

    int num_streams() const override { return static_cast<int>(streams_.size()); }
    Stream & stream(int i) override;
    using Device::stream;
    std::unique_ptr<Event> create_event() override;
    void synchronize() override;

    void * alloc_pinned(size_t bytes) override;
    void free_pinned(void * ptr) override;
    void register_host(void * ptr, size_t bytes) override;
    void unregister_host(void * ptr) override;

    // True when [ptr, ptr + bytes) lies inside this device's memory.
    bool contains(const void * ptr, size_t bytes) const;

    struct Impl;

private:
    int index_;
    std::string name_;
    std::unique_ptr<Impl> impl_;
    std::vector<std::unique_ptr<Stream>> streams_;
};

} // namespace rp
