#include "ggml_rp/roundpipe/observer.h"

#include <algorithm>

namespace rp {

namespace {

uint64_t fnv1a(const void * p, size_t n, uint64_t h) {
    const auto * b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

} // namespace

void InvariantChecker::job_memory(size_t bytes) {
    std::lock_guard<std::mutex> lk(m_);
    c_.max_job_bytes = std::max(c_.max_job_bytes, bytes);
}

void InvariantChecker::weight_group_queued(Stream & weights, const OpLabel & label,
                                           const std::vector<std::shared_ptr<Event>> & before) {
    // Runs when the weight stream reaches the group: every mark it waited for must have completed.
    weights.launch(OpLabel("check " + label.name, label.cat), [this, before] {
        int64_t bad = 0;
        for (const auto & ev : before) bad += ev->query() ? 0 : 1;
        std::lock_guard<std::mutex> lk(m_);
        c_.priority_violations += bad;
        ++c_.weight_groups_checked;
    });
}

void InvariantChecker::weights_bound(Stream & compute, const OpLabel & label, int64_t call, int layer,
                                     const std::vector<std::pair<const void *, size_t>> & spans) {
    // Hashes the bytes the compute stream reads for this layer, when it reaches this point.
    compute.launch(OpLabel("hash " + label.name, label.cat), [this, spans, call, layer] {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const auto & s : spans) h = fnv1a(s.first, s.second, h);
        std::lock_guard<std::mutex> lk(m_);
        hashes_[{call, layer}].push_back(h);
        ++c_.weight_uploads_hashed;
    });
}

void InvariantChecker::grad_downloaded(int layer, int tensor) {
    std::lock_guard<std::mutex> lk(m_);
    ++downloads_[{layer, tensor}];
}

void InvariantChecker::grad_handed_off(int layer, int tensor, int64_t calls) {
    std::lock_guard<std::mutex> lk(m_);
    int64_t & n = downloads_[{layer, tensor}];
    if (n != calls) ++c_.grad_slot_errors;
    n = 0;
    ++c_.grads_handed_off;
}

void InvariantChecker::param_unowned(int) {
    std::lock_guard<std::mutex> lk(m_);
    ++c_.grad_slot_errors;
}

PipelineChecks InvariantChecker::checks() const {
    std::lock_guard<std::mutex> lk(m_);
    PipelineChecks c = c_;
    for (const auto & [key, hashes] : hashes_)
        for (uint64_t h : hashes) c.weight_version_mismatches += h != hashes.front() ? 1 : 0;
    return c;
}

} // namespace rp
