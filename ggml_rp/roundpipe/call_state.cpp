#include "ggml_rp/roundpipe/call_state.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/memory_plan.h"

#include <algorithm>
#include <cstring>

namespace rp {

Call::Call(int64_t id_, const TrainingProgram & prog, PinnedPool & host, const std::vector<MicroBatch> & mbs, Plan plan_)
    : id(id_), M(static_cast<int>(mbs.size())), plan(std::move(plan_)) {
    const int L = prog.num_layers();
    for (const MicroBatch & mb : mbs) {
        if (!mb.ids || !mb.labels || mb.info.seq_len < 1 || mb.info.n_seq < 1)
            throw Error("forward_backward: a micro-batch has no tokens");
        if (mb.info.packed != (mb.info.positions != nullptr))
            throw Error("forward_backward: a packed micro-batch needs its positions (and only a packed one has them)");
        info.push_back(mb.info);
        const size_t tb = prog.token_bytes(mb.info);
        if (mb.info.positions) {
            positions.push_back(host.take(tb));
            std::memcpy(positions.back().data(), mb.info.positions, tb);
            info.back().positions = static_cast<const int32_t *>(positions.back().data());
        }
        if (const size_t nv = prog.sequence_values(mb.info) * static_cast<size_t>(mb.info.n_seq); nv > 0 && mb.info.sequence_values) {
            sequence_values.push_back(host.take(nv * sizeof(float)));
            std::memcpy(sequence_values.back().data(), mb.info.sequence_values, nv * sizeof(float));
            info.back().sequence_values = static_cast<const float *>(sequence_values.back().data());
        }
        ids.push_back(host.take(tb));
        std::memcpy(ids.back().data(), mb.ids, tb);
        info.back().token_ids = static_cast<const int32_t *>(ids.back().data());  // (a streamed embedding's rows)
        labels.push_back(host.take(tb));
        std::memcpy(labels.back().data(), mb.labels, tb);
        max_tokens = std::max(max_tokens, tb);
        max_hidden = std::max(max_hidden, prog.hidden_bytes(mb.info));
    }
    validate_plan(plan, L);
    stages = plan_stages(plan);
    fb = fused_stage(plan);
    for (size_t i = 0; i < stages.size(); ++i) sem.push_back(std::make_unique<Semaphore>(0));

    // Host activations: every forward stage's output, plus the checkpoints the backward stages start from.
    BoundaryBuffers bb = boundary_buffers(plan, L);
    need_act = std::move(bb.act);
    dact_buffer = std::move(bb.dact_buffer);
    act.resize(static_cast<size_t>(L));
    act_ready.resize(static_cast<size_t>(L));
    dact_ready.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
        const size_t li = static_cast<size_t>(l);
        act_ready[li].resize(static_cast<size_t>(M));
        dact_ready[li].resize(static_cast<size_t>(M));
        for (int i = 0; i < M; ++i) {
            if (need_act[li]) act[li].push_back(host.take(prog.boundary_bytes(info[static_cast<size_t>(i)])));
        }
    }
    dact_bufs.resize(static_cast<size_t>(M));
    for (int i = 0; i < M; ++i)
        for (int k = 0; k < bb.dact_buffers; ++k) dact_bufs[static_cast<size_t>(i)].push_back(host.take(prog.hidden_bytes(info[static_cast<size_t>(i)])));
    size_t results = 0;
    for (const MicroBatchInfo & mb : info) {
        loss_at.push_back(results);
        results += prog.head_results(mb);
    }
    loss = host.take(sizeof(float) * results);
    loss_ready.resize(static_cast<size_t>(M));
}

void Call::add_timed(Timed t) {
    std::lock_guard<std::mutex> lk(timed_m_);
    timed_.push_back(std::move(t));
}

bool Call::completed_timings(std::vector<Timed> & out) {
    std::lock_guard<std::mutex> lk(timed_m_);
    for (const auto & t : timed_)
        if (!t.end->query()) return false;
    out = timed_;
    return true;
}

} // namespace rp
