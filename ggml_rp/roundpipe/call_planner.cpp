#include "ggml_rp/roundpipe/call_planner.h"

#include "ggml_rp/roundpipe/planner.h"
#include "ggml_rp/runtime/arena.h"

#include <algorithm>

namespace rp {

namespace {

std::vector<MicroBatchInfo> with_chunk(std::vector<MicroBatchInfo> mbs, int64_t chunk) {
    for (MicroBatchInfo & mb : mbs) mb.token_chunk = chunk;
    return mbs;
}

std::vector<MicroBatchInfo> with_vocab_on_host(std::vector<MicroBatchInfo> mbs, bool on_host, bool pass_once = false) {
    for (MicroBatchInfo & mb : mbs) {
        mb.vocab_on_host = on_host;
        mb.vocab_pass_once = on_host && pass_once;
    }
    return mbs;
}

} // namespace


CallPlanner::CallPlanner(TrainingProgram & program, const GraphRunner & rules) : prog_(program), rules_(rules) {
    for (int l = 0; l < prog_.num_layers(); ++l) {
        size_t bytes = 0, train = 0, vocab = 0;
        for (const auto & ti : prog_.layer_tensors(l)) {
            bytes += ti.bytes;
            if (ti.param >= 0) train += ti.bytes;
            if (ti.param < 0 && ti.vocab_rows > 0) vocab += ti.bytes;
        }
        layer_bytes_.push_back(bytes);
        layer_train_bytes_.push_back(train);
        layer_vocab_bytes_.push_back(vocab);
        vocab_movable_ = vocab_movable_ || vocab > 0;
    }
    resident_bytes_ = layout_resident(prog_).bytes;
}

CallPlanner::ShapeKey CallPlanner::shape_key(const std::vector<MicroBatchInfo> & mbs) {
    ShapeKey key;
    for (const MicroBatchInfo & mb : mbs)
        key.push_back({mb.seq_len, mb.n_seq, mb.token_chunk, mb.vocab_on_host ? 1 : 0, mb.vocab_pass_once ? 1 : 0});
    std::sort(key.begin(), key.end());
    key.erase(std::unique(key.begin(), key.end()), key.end());
    return key;
}

const ProgramFootprints & CallPlanner::footprints(const std::vector<MicroBatchInfo> & mbs) {
    const ShapeKey key = shape_key(mbs);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
        if (cache_.size() >= 64) cache_.clear();  // shapes that keep changing: bound the cache
        it = cache_.emplace(key, program_footprints(prog_, mbs, rules_)).first;
    }
    return it->second;
}

CallShape CallPlanner::shape_of(const std::vector<MicroBatchInfo> & mbs, RecomputeGrain grain) const {
    CallShape s;
    s.grain = grain;
    s.vocab_on_host = !mbs.empty() && mbs.front().vocab_on_host;
    s.vocab_pass_once = s.vocab_on_host && mbs.front().vocab_pass_once;
    for (const MicroBatchInfo & mb : mbs) {
        s.hidden = std::max(s.hidden, prog_.hidden_bytes(mb));
        const bool chunked = mb.token_chunk > 0 && mb.token_chunk < mb.tokens();
        s.state = std::max(s.state, chunked ? prog_.hidden_bytes(mb) : prog_.boundary_bytes(mb));
        s.tokens = std::max(s.tokens, prog_.token_bytes(mb));
        s.head_results = std::max(s.head_results, prog_.head_results(mb));
    }
    return s;
}

DeviceMemoryPlan CallPlanner::memory_of(const Plan & plan, ScheduleKind schedule, const std::vector<MicroBatchInfo> & mbs, int sets,
                                        bool resident) {
    const std::vector<StageDesc> stages = plan_stages(plan);
    const std::vector<JobSpec> jobs = schedule_jobs(schedule, plan, stages, static_cast<int>(mbs.size()));
    CallShape shape = shape_of(mbs, plan.grain);
    shape.sets = sets;
    shape.resident = resident;
    return plan_device_memory(prog_, stages, jobs, shape, footprints(mbs));
}

Plan CallPlanner::min_memory_plan(RecomputeGrain grain) const {
    const int L = prog_.num_layers();
    std::vector<int> bwd(static_cast<size_t>(L), 1);
    return plan_from_sizes(std::vector<int>(static_cast<size_t>(L - 1), 1), bwd, grain);
}

DeviceMemoryPlan CallPlanner::least_memory(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) {
    const Plan p = req.schedule != ScheduleKind::RoundPipe ? bound_plan(prog_.num_layers(), req.devices, req.grain)
                   : req.plan                              ? *req.plan
                                                           : min_memory_plan(req.grain);
    return memory_of(p, req.schedule, least_mbs(req, mbs), 1);
}

std::vector<MicroBatchInfo> CallPlanner::least_mbs(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) const {
    return with_vocab_on_host(with_chunk(mbs, chunk_candidates(req, mbs).back()), vocab_candidates(req).back());
}

std::vector<bool> CallPlanner::vocab_candidates(const CallPlanRequest & req) const {
    if (!vocab_movable_ || req.vocab_on_host == 0) return {false};
    if (req.vocab_on_host > 0) return {true};
    return {false, true};
}

int64_t CallPlanner::max_seq_len(const CallPlanRequest & req, int64_t n_seq, int M, int64_t limit) {
    const Plan p = min_memory_plan(req.grain);
    auto fits = [&](int64_t T) {
        MicroBatchInfo mb;
        mb.seq_len = T;
        mb.n_seq = n_seq;
        std::vector<MicroBatchInfo> mbs(static_cast<size_t>(std::max(M, 1)), mb);
        mbs = least_mbs(req, mbs);  // the least memory
        const bool ok = memory_of(p, ScheduleKind::RoundPipe, mbs, 1).peak() <= req.device_memory;
        cache_.erase(shape_key(mbs));  // probes: do not keep them
        return ok;
    };
    if (req.device_memory == 0 || fits(limit)) return limit;
    int64_t lo = 0, hi = limit;  // fits(lo) (0: vacuous), !fits(hi)
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

std::vector<int64_t> CallPlanner::chunk_candidates(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) {
    if (req.token_chunk >= 0) return {req.token_chunk};
    int64_t tokens = 0;
    for (const MicroBatchInfo & mb : mbs) tokens = std::max(tokens, mb.tokens());
    std::vector<int64_t> c{0};  // one graph per program is the fastest: chunking recomputes the attention once more
    for (int64_t k = 8192; k >= 256; k /= 2)
        if (k < tokens) c.push_back(k);
    return c;
}

CallPlan CallPlanner::plan(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) {
    if (mbs.empty()) throw Error("call planner: no micro-batches");
    if (req.device_memories.empty()) return plan_uniform(req, mbs);
    if (req.device_memories.size() != static_cast<size_t>(req.devices) || req.device_names.size() != req.device_memories.size())
        throw Error("call planner: " + std::to_string(req.device_memories.size()) + " device sizes and " +
                    std::to_string(req.device_names.size()) + " names for " + std::to_string(req.devices) + " devices");
    std::vector<size_t> sizes = req.device_memories;
    for (size_t d = 0; d < sizes.size(); ++d)
        if (sizes[d] == 0) throw Error("call planner: " + req.device_names[d] + " has no memory");
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    if (req.schedule != ScheduleKind::RoundPipe) sizes.resize(1);
    auto request_for = [&](size_t bytes) {
        CallPlanRequest r = req;
        r.device_memories.clear();
        r.device_names.clear();
        r.device_memory = bytes;
        const size_t d = static_cast<size_t>(std::find(req.device_memories.begin(), req.device_memories.end(), bytes) - req.device_memories.begin());
        r.device_name = req.device_names[d];
        return r;
    };
    for (size_t i = 0; i < sizes.size(); ++i) {
        try {
            CallPlan cp = plan_uniform(request_for(sizes[i]), mbs);
            if (i > 0) restrict_to_devices(cp, req, mbs);
            return cp;
        } catch (const MemoryError & e) {
            if (i + 1 < sizes.size()) continue;
            std::string devices;
            for (size_t d = 0; d < req.device_memories.size(); ++d)
                devices += (d ? ", " : "") + req.device_names[d] + " " + format_bytes(req.device_memories[d]);
            throw MemoryError("no device holds a plan (" + devices + "): the largest, " + e.what(), e.needed(), e.available(),
                              e.max_seq_len());
        }
    }
    throw Error("call planner: no device sizes");  // (unreachable: sizes is not empty)
}

void CallPlanner::restrict_to_devices(CallPlan & cp, const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) {
    const std::vector<StageDesc> stages = plan_stages(cp.plan);
    const std::vector<JobSpec> jobs = schedule_jobs(req.schedule, cp.plan, stages, static_cast<int>(mbs.size()));
    std::vector<MicroBatchInfo> ran = mbs;
    for (MicroBatchInfo & mb : ran) cp.apply(mb);
    const ProgramFootprints & fp = footprints(ran);
    // Each stage's own regions (its jobs'): with the call's residency, and for a resident call also streamed — a
    // device too small for the resident region beside a stage may run the stage with its weights streamed.
    std::vector<std::vector<JobSpec>> of_stage(stages.size());
    for (const JobSpec & j : jobs) of_stage[static_cast<size_t>(j.tasks.front().stage)].push_back(j);
    auto own_regions = [&](bool resident) {
        CallShape shape = cp.shape;
        shape.resident = resident;
        std::vector<DeviceMemoryPlan> own;
        for (size_t s = 0; s < stages.size(); ++s) own.push_back(plan_device_memory(prog_, stages, of_stage[s], shape, fp));
        return own;
    };
    const std::vector<DeviceMemoryPlan> own = own_regions(cp.shape.resident);
    const std::vector<DeviceMemoryPlan> streamed = cp.shape.resident ? own_regions(false) : std::vector<DeviceMemoryPlan>{};
    // The stages a device of `cap` bytes takes, the smallest first while their regions together fit.
    struct Taken {
        std::vector<char> stage;
        DeviceMemoryPlan regions;
        int n = 0;
    };
    auto take = [&](const std::vector<DeviceMemoryPlan> & regions, size_t cap) {
        std::vector<size_t> order(stages.size());
        for (size_t s = 0; s < order.size(); ++s) order[s] = s;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return regions[a].peak() < regions[b].peak(); });
        Taken t;
        t.stage.assign(stages.size(), 0);
        for (size_t s : order) {
            const DeviceMemoryPlan m = t.n == 0 ? regions[s] : t.regions.max(regions[s]);
            if (m.peak() > cap) continue;
            t.regions = m;
            t.stage[s] = 1;
            ++t.n;
        }
        return t;
    };
    const size_t G = req.device_memories.size();
    cp.stage_devices.assign(stages.size(), std::vector<char>(G, 0));
    cp.device_regions.assign(G, DeviceMemoryPlan{});
    for (size_t d = 0; d < G; ++d) {
        const size_t cap = req.device_memories[d];
        if (cp.memory.peak() <= cap) {
            for (auto & s : cp.stage_devices) s[d] = 1;
            cp.device_regions[d] = cp.memory;
            continue;
        }
        Taken t = take(own, cap);
        bool streams = false;
        if (!streamed.empty()) {
            Taken u = take(streamed, cap);
            if (u.n > t.n) t = std::move(u), streams = true;
        }
        for (size_t s = 0; s < stages.size(); ++s) cp.stage_devices[s][d] = t.stage[s];
        cp.device_regions[d] = t.regions;
        std::string which;
        for (size_t s = 0; s < stages.size(); ++s)
            if (t.stage[s]) which += (which.empty() ? "" : " ") + stages[s].name;
        cp.plan.notes.push_back("memory: " + req.device_names[d] + ", " + format_bytes(cap) + ", " +
                                (t.n == 0 ? std::string("holds no stage of the plan: it runs no job")
                                          : "runs " + std::to_string(t.n) + " of the " + std::to_string(stages.size()) + " stages (" +
                                                which + ")" +
                                                (streams ? ", their weights streamed with each job (the resident frozen weights do not fit beside them)"
                                                         : "") +
                                                ", peak " + format_bytes(t.regions.peak())));
    }
}

CallPlan CallPlanner::plan_uniform(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) {
    // Fastest first: the frozen weights resident (no weight traffic but the trainable tensors'), every chunk
    // candidate with two activation sets per stage; then streamed the same way, then the smallest chunk with one
    // set. Only then the vocabulary matrices on the host (vocab_candidates), whose head crosses the link for every
    // micro-batch: every chunk with two sets, the head's rows once per micro-batch (vocab_pass_once: all the
    // tokens' state held) before once per token range; then the smallest chunk with one set, the least memory.
    const std::vector<int64_t> chunks = chunk_candidates(req, mbs);
    const std::vector<bool> on_host = vocab_candidates(req);
    const bool try_resident = req.resident && resident_bytes_ > 0 && !on_host.front();
    if (try_resident && (req.device_memory == 0 || resident_bytes_ < req.device_memory))
        for (const int64_t c : chunks)
            if (std::optional<CallPlan> p = plan_fixed(req, with_chunk(mbs, c), 2, false, true)) {
                p->plan.notes.push_back("memory: the frozen weights (" + format_bytes(resident_bytes_) +
                                        ") stay on every device; each job uploads only the trainable tensors");
                return *p;
            }
    const int64_t smallest = chunks.back();
    std::optional<CallPlan> p;
    for (size_t k = 0; k < on_host.size() && !p; ++k) {
        const bool host = on_host[k], least = k + 1 == on_host.size();
        for (const int64_t c : chunks) {
            if (host && c > 0 && (p = plan_fixed(req, with_vocab_on_host(with_chunk(mbs, c), true, true), 2, false, false))) break;
            if ((p = plan_fixed(req, with_vocab_on_host(with_chunk(mbs, c), host), 2, false, false))) break;
        }
        if (!p && host && smallest > 0) p = plan_fixed(req, with_vocab_on_host(with_chunk(mbs, smallest), true, true), 1, false, false);
        if (!p) p = plan_fixed(req, with_vocab_on_host(with_chunk(mbs, smallest), host), 1, least, false);
    }
    if (p->shape.vocab_on_host)
        p->plan.notes.push_back(std::string("memory: the embedding and LM-head matrices stay in host memory; the programs upload the rows they "
                                            "read (the head range by range, ") +
                                (p->shape.vocab_pass_once || p->token_chunk == 0 ? "once for every micro-batch)" : "for every token range)"));
    if (try_resident)
        p->plan.notes.push_back("memory: the frozen weights (" + format_bytes(resident_bytes_) + ") do not fit beside a plan on " +
                                format_bytes(req.device_memory) + ": every job uploads its weights");
    return *p;
}

std::optional<CallPlan> CallPlanner::plan_fixed(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs, int sets,
                                                bool last, bool resident) {
    const int L = prog_.num_layers();
    const size_t cap = req.device_memory;
    CallPlan out;
    out.shape = shape_of(mbs, req.grain);  // (vocab_on_host: the micro-batches')
    out.shape.sets = sets;
    out.shape.resident = resident;
    out.token_chunk = mbs.front().token_chunk;
    auto fits = [&](const DeviceMemoryPlan & m) { return cap == 0 || m.peak() <= cap; };
    int64_t longest = 0, widest = 0;
    for (const MicroBatchInfo & mb : mbs) longest = std::max(longest, mb.seq_len), widest = std::max(widest, mb.n_seq);
    const std::string shape = std::to_string(mbs.size()) + " micro-batch" + (mbs.size() == 1 ? "" : "es") + " of seq_len " +
                              std::to_string(longest) + " x n_seq " + std::to_string(widest);
    auto too_big = [&](const Plan & p, const DeviceMemoryPlan & m, const std::string & which, bool smallest) {
        const int64_t fit = max_seq_len(req, widest, static_cast<int>(mbs.size()), longest);
        std::string msg = (req.device_name.empty() ? std::string("a device") : req.device_name) + " has " +
                          format_bytes(cap) + " of memory; " + which + " (" + p.describe() + ") for " + shape +
                          " needs " + format_bytes(m.peak()) + ": " + m.describe() + ". ";
        if (!smallest && fit == longest)
            msg += "The RoundPipe schedule with one layer per stage fits it";
        else if (fit > 0)
            msg += std::string(smallest ? "The" : "With one layer per stage, the") + " largest seq_len that fits is " +
                   std::to_string(fit) + " (at n_seq " + std::to_string(widest) + ")";
        else
            msg += "Not even seq_len 1 fits: one layer's weights and gradients need more than the device has";
        throw MemoryError(msg, m.peak(), cap, fit);
    };

    // Pinned plans and the bound schedules: checked, never changed.
    if (req.schedule != ScheduleKind::RoundPipe || req.plan) {
        out.plan = req.schedule != ScheduleKind::RoundPipe ? bound_plan(L, req.devices, req.grain) : *req.plan;
        out.memory = memory_of(out.plan, req.schedule, mbs, sets, resident);
        if (fits(out.memory)) return out;
        if (!last) return std::nullopt;
        too_big(out.plan, out.memory, req.plan ? "the given plan" : std::string(schedule_name(req.schedule)) + "'s plan", false);
    }

    PlannerInput in;
    if (req.tf.size() == static_cast<size_t>(L) && req.tb.size() == static_cast<size_t>(L)) {
        in.tf = req.tf;
        in.tb = req.tb;
    } else {
        cold_start_times(layer_bytes_, in.tf, in.tb);
    }
    size_t largest = 0;
    for (int l = 0; l < L; ++l) {
        const size_t li = static_cast<size_t>(l);
        // (a vocabulary matrix on the host is in no slot)
        const size_t bytes = layer_bytes_[li] - (out.shape.vocab_on_host ? layer_vocab_bytes_[li] : 0);
        in.mf.push_back(bytes);
        // A backward stage also keeps one hidden state per layer (the recomputed inputs).
        in.mb.push_back(bytes + layer_train_bytes_[li] + out.shape.hidden);
        largest = std::max(largest, in.mb.back());
    }
    in.min_stages = req.devices;
    in.grain = req.grain;
    for (int l = 0; l < L; ++l) in.layer_names.push_back(prog_.layer_name(l));

    // The partitioner's cap per stage is limit / 2, of what the resident region leaves.
    const size_t stage_memory = resident ? cap - std::min(cap, resident_bytes_) : cap;
    size_t limit = cap == 0 ? 0 : 2 * stage_memory;
    for (int round = 0; round < 64; ++round) {
        in.memory_limit = limit;
        Plan p = make_plan(in);
        DeviceMemoryPlan m = memory_of(p, ScheduleKind::RoundPipe, mbs, sets, resident);
        if (fits(m)) {
            out.plan = std::move(p);
            out.memory = m;
            if (round > 0) out.plan.notes.push_back("memory: stage cap lowered to " + format_bytes(limit / 2) + " so the plan fits " + format_bytes(cap));
            return out;
        }
        if (limit <= 2 * largest) break;  // the partitioner keeps every layer-sized stage from here on
        const double ratio = static_cast<double>(stage_memory) / static_cast<double>(m.peak() - m.resident);
        limit = static_cast<size_t>(static_cast<double>(limit) * std::min(0.9, ratio));
    }
    Plan p = min_memory_plan(req.grain);
    DeviceMemoryPlan m = memory_of(p, ScheduleKind::RoundPipe, mbs, sets, resident);
    if (!fits(m) && !last) return std::nullopt;
    if (!fits(m)) too_big(p, m, "the smallest plan, one layer per stage", true);
    p.notes.push_back("memory: one layer per stage, the only plan that fits " + format_bytes(cap));
    out.plan = std::move(p);
    out.memory = m;
    return out;
}

} // namespace rp
