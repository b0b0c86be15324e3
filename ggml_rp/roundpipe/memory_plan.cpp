#include "ggml_rp/roundpipe/memory_plan.h"

#include "ggml_rp/runtime/arena.h"

#include <algorithm>
#include <set>
#include <utility>

namespace rp {

namespace {

// A bump layout: buffers one after the other, each rounded to the arenas' unit.
struct Bump {
    size_t at = 0;
    size_t take(size_t bytes) {
        const size_t o = at;
        at += align_buffer(bytes);
        return o;
    }
};

// The input-gradient buffers a backward walk over [a, b) uses: one per layer that has an input gradient
// (every layer but 0), two at most (they alternate).
int grad_buffers(int a, int b) { return std::min(2, b - std::max(a, 1)); }

ActSetLayout layout_set(const StageDesc & sd, const CallShape & sh, int L, Bump & m) {
    const int a = sd.layers.begin, b = sd.layers.end, k = sd.layers.size();
    const size_t H = sh.hidden, S = sh.state_bytes(), I = sh.tokens;  // (gradients H, states S)
    ActSetLayout s;
    switch (sd.pass) {
    case Pass::Fwd:
        s.in.push_back(m.take(a == 0 ? I : S));
        for (int i = 0; i < std::min(k, 2); ++i) s.work.push_back(m.take(S));  // outputs, ping-pong
        break;
    case Pass::Fused:
        s.in.push_back(m.take(a == 0 ? I : S));
        for (int i = 1; i < k; ++i) s.work.push_back(m.take(S));  // inputs of layers a+1 .. L-1, kept for the backward
        s.labels = m.take(I);
        // The head writes d[0]; the walk from L-2 down to a alternates d[1], d[0], ... for the layers with an
        // input gradient (all but layer 0).
        s.d[0] = m.take(H);
        if (L - 2 >= std::max(a, 1)) s.d[1] = m.take(H);
        s.loss = m.take(sizeof(float) * sh.head_results);
        break;
    case Pass::Bwd:
        if (sh.grain == RecomputeGrain::Layer) {
            // One checkpoint per layer, uploaded just before its backward into two alternating buffers.
            for (int j = 0; j < std::min(k, 2); ++j) {
                size_t bytes = 0;
                for (int l = b - 1 - j; l >= a; l -= 2) bytes = std::max(bytes, l == 0 ? I : S);
                s.in.push_back(m.take(bytes));
            }
        } else {
            s.in.push_back(m.take(a == 0 ? I : S));
            for (int i = 1; i < k; ++i) s.work.push_back(m.take(S));  // the recomputed inputs of layers a+1 .. b-1
        }
        s.dout = m.take(H);
        for (int i = 0; i < grad_buffers(a, b); ++i) s.d[i] = m.take(H);
        break;
    }
    return s;
}

std::string layers_of(const TrainingProgram & prog, LayerRange r) {
    if (r.size() == 1) return prog.layer_name(r.begin);
    return prog.layer_name(r.begin) + " .. " + prog.layer_name(r.end - 1);
}

} // namespace

ResidentLayout layout_resident(const TrainingProgram & prog) {
    ResidentLayout r;
    Bump m;
    std::map<std::pair<const void *, size_t>, size_t> placed;  // host bytes -> offset: a tensor two layers share once
    for (int l = 0; l < prog.num_layers(); ++l) {
        std::vector<size_t> data;
        for (const auto & ti : prog.layer_tensors(l)) {
            if (ti.param >= 0) {
                data.push_back(kNoBuffer);
                continue;
            }
            const auto [it, added] = placed.try_emplace({ti.host, ti.bytes}, m.at);
            if (added) m.take(ti.bytes);
            data.push_back(it->second);
        }
        r.data.push_back(std::move(data));
    }
    r.bytes = m.at;
    return r;
}

JobLayout layout_job(const TrainingProgram & prog, const std::vector<StageDesc> & stages, const CallShape & shape,
                     const JobSpec & spec) {
    JobLayout j;
    Bump w;
    for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
        std::vector<size_t> data, grad;
        for (const auto & ti : prog.layer_tensors(l)) {
            const bool elsewhere = ti.param < 0 && (shape.resident || (shape.vocab_on_host && ti.vocab_rows > 0));  // resident / on the host
            data.push_back(elsewhere ? kNoBuffer : w.take(ti.bytes));
            grad.push_back(spec.has_grads && ti.param >= 0 ? w.take(ti.bytes) : kNoBuffer);
        }
        j.data.push_back(std::move(data));
        j.grad.push_back(std::move(grad));
    }
    j.weight_bytes = w.at;
    std::map<int, int> tasks;  // per stage
    for (const Task & t : spec.tasks) ++tasks[t.stage];
    Bump a;
    for (const auto & [stage, n] : tasks)
        for (int i = 0; i < std::min(n, shape.sets); ++i)
            j.sets[stage].push_back(layout_set(stages[static_cast<size_t>(stage)], shape, prog.num_layers(), a));
    j.activation_bytes = a.at;
    return j;
}

ProgramFootprints program_footprints(TrainingProgram & prog, const std::vector<MicroBatchInfo> & mbs,
                                     const GraphRunner & rules) {
    const int L = prog.num_layers();
    ProgramFootprints fp;
    fp.forward.assign(static_cast<size_t>(L), 0);
    fp.backward.assign(static_cast<size_t>(L), 0);
    std::set<std::pair<int64_t, int64_t>> seen;
    for (const MicroBatchInfo & mb : mbs) {
        if (!seen.insert({mb.seq_len, mb.n_seq}).second) continue;  // footprints depend on the shape only
        for (int l = 0; l < L - 1; ++l) {
            const size_t li = static_cast<size_t>(l);
            fp.forward[li] = std::max(fp.forward[li], prog.program_footprint(ProgramKind::Forward, l, mb, rules));
            fp.backward[li] = std::max(fp.backward[li], prog.program_footprint(ProgramKind::Backward, l, mb, rules));
        }
        fp.head = std::max(fp.head, prog.program_footprint(ProgramKind::Head, L - 1, mb, rules));
    }
    return fp;
}

DeviceMemoryPlan DeviceMemoryPlan::max(const DeviceMemoryPlan & o) const {
    DeviceMemoryPlan r = *this;
    if (o.weight_slot > r.weight_slot) r.weight_slot = o.weight_slot, r.weight_by = o.weight_by;
    if (o.activations > r.activations) r.activations = o.activations, r.activations_by = o.activations_by;
    if (o.graph > r.graph) r.graph = o.graph, r.graph_by = o.graph_by;
    r.resident = std::max(r.resident, o.resident);
    return r;
}

std::string DeviceMemoryPlan::describe() const {
    return (resident ? format_bytes(resident) + " resident frozen weights + " : std::string()) + "2 x " + format_bytes(weight_slot) + " weight slots (" + weight_by + ") + " + format_bytes(activations) +
           " activations (" + activations_by + ") + " + format_bytes(graph) + " graph (" + graph_by + ")";
}

DeviceMemoryPlan plan_device_memory(const TrainingProgram & prog, const std::vector<StageDesc> & stages,
                                    const std::vector<JobSpec> & jobs, const CallShape & shape,
                                    const ProgramFootprints & fp) {
    DeviceMemoryPlan m;
    if (shape.resident) m.resident = layout_resident(prog).bytes;
    const int L = prog.num_layers();
    for (const JobSpec & spec : jobs) {
        const JobLayout j = layout_job(prog, stages, shape, spec);
        DeviceMemoryPlan p;
        p.weight_slot = j.weight_bytes;
        p.weight_by = "job " + spec.label + ": " + layers_of(prog, spec.layers) + (spec.has_grads ? ", with gradients" : "");
        p.activations = j.activation_bytes;
        p.activations_by = "job " + spec.label + (shape.sets == 1 ? ", 1 set per stage" : "");
        // The programs the job runs: forwards (forward stages, the fused tail's layers, stage-grain recomputes),
        // backwards, the head.
        std::set<int> stage_set;
        for (const Task & t : spec.tasks) stage_set.insert(t.stage);
        auto program = [&](size_t bytes, const char * kind, int l) {
            if (align_buffer(bytes) > p.graph) {
                p.graph = align_buffer(bytes);  // regions are whole arena units
                p.graph_by = std::string(kind) + " of " + prog.layer_name(l);
            }
        };
        for (int s : stage_set) {
            const StageDesc & sd = stages[static_cast<size_t>(s)];
            const int a = sd.layers.begin, b = sd.layers.end;
            for (int l = a; l < b; ++l) {
                const size_t li = static_cast<size_t>(l);
                if (l == L - 1) {
                    program(fp.head, "the head program", l);
                    continue;
                }
                const bool recomputes = sd.pass == Pass::Bwd && shape.grain == RecomputeGrain::Stage && l < b - 1;
                if (sd.pass != Pass::Bwd || recomputes) program(fp.forward[li], "forward", l);
                if (sd.pass != Pass::Fwd) program(fp.backward[li], "backward", l);
            }
        }
        m = m.max(p);
    }
    return m;
}

BoundaryBuffers boundary_buffers(const Plan & plan, int L) {
    BoundaryBuffers b;
    b.act.assign(static_cast<size_t>(L), 0);
    b.dact.assign(static_cast<size_t>(L), 0);
    for (const LayerRange & r : plan.fwd) b.act[static_cast<size_t>(r.end)] = 1;
    for (size_t i = 1; i < plan.bwd.size(); ++i) {
        const LayerRange & r = plan.bwd[i];
        if (plan.grain == RecomputeGrain::Layer)
            for (int l = r.begin; l < r.end; ++l) b.act[static_cast<size_t>(l)] = 1;
        else
            b.act[static_cast<size_t>(r.begin)] = 1;
    }
    for (const LayerRange & r : plan.bwd) b.dact[static_cast<size_t>(r.begin)] = 1;
    b.act[0] = 0;
    b.dact[0] = 0;
    b.dact_buffer.assign(static_cast<size_t>(L), -1);
    int n = 0;
    for (int l = L - 1; l > 0; --l)
        if (b.dact[static_cast<size_t>(l)]) b.dact_buffer[static_cast<size_t>(l)] = n++ % 2;
    b.dact_buffers = std::min(n, 2);
    return b;
}

HostCallBytes host_call_bytes(const TrainingProgram & prog, const Plan & plan, const std::vector<MicroBatchInfo> & mbs) {
    const BoundaryBuffers bb = boundary_buffers(plan, prog.num_layers());
    HostCallBytes h;
    for (const MicroBatchInfo & mb : mbs) {
        h.tokens += 2 * prog.token_bytes(mb);
        for (size_t l = 0; l < bb.act.size(); ++l)
            if (bb.act[l]) h.checkpoints += prog.boundary_bytes(mb);
        h.gradients += static_cast<size_t>(bb.dact_buffers) * prog.hidden_bytes(mb);
    }
    for (const MicroBatchInfo & mb : mbs)  // the heads' results, and the sequence values they read
        h.losses += sizeof(float) * (prog.head_results(mb) + prog.sequence_values(mb) * static_cast<size_t>(mb.n_seq));
    return h;
}

LinkBytes link_bytes(const TrainingProgram & prog, const Plan & plan, ScheduleKind schedule, const std::vector<MicroBatchInfo> & mbs,
                     bool resident) {
    const std::vector<StageDesc> stages = plan_stages(plan);
    const BoundaryBuffers bb = boundary_buffers(plan, prog.num_layers());
    LinkBytes x;
    if (resident)
        for (int l = 0; l < prog.num_layers(); ++l)
            for (const auto & ti : prog.layer_tensors(l))
                if (ti.param < 0) x.resident_once += ti.bytes;
    // What run_task moves per micro-batch (device_worker.cpp), and what run_job moves per job.
    const bool on_host = !resident && !mbs.empty() && mbs.front().vocab_on_host;
    auto vocab = [&](const TrainingProgram::TensorInfo & ti) { return on_host && ti.param < 0 && ti.vocab_rows > 0; };
    // What the programs of a pass over layers [a, b) upload of the streamed tensors for micro-batch mb.
    const int L = prog.num_layers();
    auto streamed_up = [&](int a, int b, Pass pass, const MicroBatchInfo & mb) {
        size_t up = 0;
        if (!on_host) return up;
        if (a == 0 && pass != Pass::Bwd)  // the embedding's rows of the tokens
            for (const auto & ti : prog.layer_tensors(0))
                if (vocab(ti)) up += ti.bytes / static_cast<size_t>(ti.vocab_rows) * static_cast<size_t>(mb.tokens());
        if (b == L && pass == Pass::Fused) {  // the head's every row, once or for each token range
            const int64_t n = mb.tokens(), c = mb.token_chunk > 0 && mb.token_chunk < n && !mb.vocab_pass_once ? mb.token_chunk : n;
            for (const auto & ti : prog.layer_tensors(L - 1))
                if (vocab(ti)) up += ti.bytes * static_cast<size_t>((n + c - 1) / c);
        }
        return up;
    };
    for (const JobSpec & spec : schedule_jobs(schedule, plan, stages, static_cast<int>(mbs.size()))) {
        for (int l = spec.layers.begin; l < spec.layers.end; ++l)
            for (const auto & ti : prog.layer_tensors(l)) {
                if ((!resident || ti.param >= 0) && !vocab(ti)) x.weights_up += ti.bytes;
                if (spec.has_grads && ti.param >= 0) x.grads_down += ti.bytes;
            }
        for (const Task & t : spec.tasks) {
            const StageDesc & sd = stages[static_cast<size_t>(t.stage)];
            const MicroBatchInfo & mb = mbs[static_cast<size_t>(t.mb)];
            // (hidden states: S bytes; their gradients: H)
            const size_t H = prog.hidden_bytes(mb), S = prog.boundary_bytes(mb), I = prog.token_bytes(mb);
            const int a = sd.layers.begin, b = sd.layers.end;
            x.vocab_rows_up += streamed_up(a, b, sd.pass, mb);
            auto input = [&](int l) { return l == 0 ? I : S; };
            switch (sd.pass) {
            case Pass::Fwd:
                x.activations_up += input(a);
                for (int l = a; l < b; ++l) x.activations_down += bb.act[static_cast<size_t>(l + 1)] ? S : 0;
                break;
            case Pass::Fused:
                x.activations_up += input(a) + I;
                x.activations_down += sizeof(float) + (a > 0 ? H : 0);
                break;
            case Pass::Bwd:
                x.activations_up += H;  // the incoming gradient
                if (plan.grain == RecomputeGrain::Layer)
                    for (int l = a; l < b; ++l) x.activations_up += input(l);
                else
                    x.activations_up += input(a);
                x.activations_down += a > 0 ? H : 0;
                break;
            }
        }
    }
    return x;
}

} // namespace rp
