// What the runtime tells an observer, so that the invariant instrumentation (roundpipe.md §14: I4, I6, I7,
// I8) lives outside the hot path: the runtime calls these hooks unconditionally, the default observer does
// nothing, and InvariantChecker counts every violation. Hooks that need the device's view (bytes the compute
// stream will read, whether an event has completed when a copy starts) get the stream and may enqueue a
// launch on it; the others run on the calling actor's thread. Every hook must be thread-safe.
#pragma once

#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace rp {

class PipelineObserver {
public:
    virtual ~PipelineObserver() = default;
    // Device thread: a job's device memory (weights, gradients, activation slots; as the arena rounds). [I7]
    virtual void job_memory(size_t bytes) {}
    // Device thread: a group of weight chunks on `weights` was queued behind the pending activation marks
    // `before` (it must not start before they complete). [I8]
    virtual void weight_group_queued(Stream & weights, const OpLabel & label, const std::vector<std::shared_ptr<Event>> & before) {}
    // Device thread: layer `layer`'s weights of call `call` are bound; `compute` reads `spans` from here on. [I4]
    virtual void weights_bound(Stream & compute, const OpLabel & label, int64_t call, int layer,
                               const std::vector<std::pair<const void *, size_t>> & spans) {}
    // Device thread: the D2H of gradient slot (layer, tensor) was enqueued. [I6]
    virtual void grad_downloaded(int layer, int tensor) {}
    // Optimizer thread: slot (layer, tensor) was handed off, at the end of a step of `calls` calls. [I6]
    virtual void grad_handed_off(int layer, int tensor, int64_t calls) {}
    // Optimizer thread: a trainable parameter no layer owns (it would never get a gradient). [I6]
    virtual void param_unowned(int param) {}
};

// What InvariantChecker saw (all zero = every invariant held).
struct PipelineChecks {
    int64_t weight_version_mismatches = 0;  // I4: forward and recompute read different bytes of a layer
    int64_t weight_uploads_hashed = 0;
    int64_t grad_slot_errors = 0;           // I6: a slot downloaded != once per call, or handed off != once per step
    int64_t grads_handed_off = 0;
    int64_t priority_violations = 0;        // I8: a weight chunk ran before an activation upload it was queued behind
    int64_t weight_groups_checked = 0;
    int64_t flag_violations = 0;            // a host flag set twice without a clear in between (sync.h)
    size_t max_job_bytes = 0;               // I7: largest weights + grads + activation slots of one job
};

// Counts violations of I4, I6, I7, I8. Hashing every weight upload is slow: tests only.
class InvariantChecker final : public PipelineObserver {
public:
    void job_memory(size_t bytes) override;
    void weight_group_queued(Stream & weights, const OpLabel & label, const std::vector<std::shared_ptr<Event>> & before) override;
    void weights_bound(Stream & compute, const OpLabel & label, int64_t call, int layer,
                       const std::vector<std::pair<const void *, size_t>> & spans) override;
    void grad_downloaded(int layer, int tensor) override;
    void grad_handed_off(int layer, int tensor, int64_t calls) override;
    void param_unowned(int param) override;

    // The counts so far (flag_violations is the pipeline's to fill in).
    PipelineChecks checks() const;

private:
    mutable std::mutex m_;
    PipelineChecks c_;
    std::map<std::pair<int64_t, int>, std::vector<uint64_t>> hashes_;  // (call, layer) -> hash per upload
    std::map<std::pair<int, int>, int64_t> downloads_;                 // (layer, tensor) -> D2H this step
};

} // namespace rp
