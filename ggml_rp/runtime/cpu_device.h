// The CPU virtual device: a Device whose streams are worker threads, whose memory is a bounded arena over one
// host allocation and whose copies are memcpys, optionally slowed to a modelled link. N of them make the
// whole RoundPipe scheduler testable without a GPU (roundpipe.md §16):
//
// - one worker thread per stream executes that stream's queue in order; waits block on a condition
//   variable (no busy waiting); destruction finishes every queued item, then joins;
// - copies: H2D and D2H each go through their own link (PCIe is full duplex) with bandwidth and latency;
//   a copy reserves the link from max(now, link free) for latency + n / bandwidth, does the memcpy and then
//   sleeps out the remainder, so two streams uploading at once share the link one after the other;
// - speed (mixed-GPU emulation, issue #37): a device of speed s < 1 sleeps out (1/s - 1) of each launch's own
//   time after it, so its compute takes 1/s as long (copies are the link's, not scaled); set_speed changes it
//   mid-run (a straggler);
// - delay injection (delay_seed != 0): before every queued item the worker sleeps a random
//   [0, max_delay_us] drawn from a per-stream generator seeded by (seed, device, stream), to shake out
//   missing events in race fuzzing;
// - hook: every executed launch and copy is reported (device, stream, label, start/end, bytes);
// - its graph runner is a CpuGraphRunner over its arena (runtime/graph_runner.h);
// - a job that throws poisons its stream (CUDA's sticky error): later launches and copies of that stream
//   are skipped, records still complete (so no other stream dead-locks) and synchronize() rethrows.
#pragma once

#include "ggml_rp/runtime/arena_device.h"
#include "ggml_rp/runtime/link_model.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rp {

// Fault injection, for the error paths' tests: the Nth device allocation / copy / kernel launch of this
// device fails with rp::Error naming the device, the stream and the operation (0: never).
struct FaultPlan {
    int64_t alloc_at = 0, copy_at = 0, launch_at = 0;
    bool any() const { return alloc_at > 0 || copy_at > 0 || launch_at > 0; }
};

struct CpuDeviceOptions {
    size_t memory_bytes = size_t(64) << 20;
    int num_streams = kNumStreamKinds;  // at least kNumStreamKinds
    std::optional<LinkModel> link;      // H2D and D2H links; none = memcpy speed
    uint64_t delay_seed = 0;            // 0 = no delay injection
    double max_delay_us = 0;
    OpHook hook;                        // may be empty
    std::string name;                   // default "cpu:<index>"
    FaultPlan faults;
    double speed = 1.0;                 // (0, 1]: the fraction of the host's compute speed (see above)
};

class CpuDevice final : public ArenaDevice {
public:
    CpuDevice(int index, CpuDeviceOptions options = {});
    ~CpuDevice() override;
    CpuDevice(const CpuDevice &) = delete;
    CpuDevice & operator=(const CpuDevice &) = delete;

    std::unique_ptr<Event> create_event() override;
    void * allocate(size_t bytes, const std::string & what) override;

    void * alloc_pinned(size_t bytes) override;
    void free_pinned(void * ptr) override;
    void register_host(void * ptr, size_t bytes, bool read_only = false) override;
    void unregister_host(void * ptr) override;

    // The compute speed from the next launch on, (0, 1] (rp::Error otherwise): a device that slows mid-run.
    void set_speed(double speed);
    double speed() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

} // namespace rp
