#include "models/train/run_plan.h"

#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/roundpipe/footprint_rules.h"
#include "ggml_rp/runtime/graph_runner.h"
#include "models/train/session.h"
#include "models/train/trainer.h"

#include <algorithm>
#include <optional>
#include <cstdio>
#include <set>
#include <string>

namespace rp {

namespace {

// "1.50 MiB": format_bytes without the byte count.
std::string human_bytes(size_t bytes) {
    const std::string s = format_bytes(bytes);
    return s.substr(0, s.find(" ("));
}

// "key: N bytes (1.50 MiB) more": the byte count first, for scripts.
std::string line(const std::string & key, size_t bytes, const std::string & more = "") {
    std::string r = key + ": " + std::to_string(bytes) + " bytes (" + human_bytes(bytes);
    r += ')';
    if (!more.empty()) r.append(" ").append(more);
    r += '\n';
    return r;
}

} // namespace

RunPlan plan_run(const Model & model, const RunPlanOptions & options) {
    const SessionOptions & o = options.session;
    const int64_t seq_len = options.seq_len, micro_batches = resolved_micro_batches(o);
    const int devices = o.pipelined ? o.devices.count : 0;
    const std::string & backend = o.devices.backend;
    if (seq_len < 1) throw Error("seq_len " + std::to_string(seq_len) + " must be at least 1");
    if (o.batch < 1) throw Error("batch_size " + std::to_string(o.batch) + " must be at least 1");
    if (micro_batches < 1 || micro_batches > o.batch)
        throw Error("micro_batches " + std::to_string(micro_batches) + " must be in [1, batch_size = " + std::to_string(o.batch) + "]");
    FinetuneConfig fc = o.finetune;
    if (fc.context == 0) fc.context = seq_len;
    // Packed preference pairs: the head sums answers by slot (how many a sequence holds changes a few floats)
    if (fc.preference && options.packed) fc.answer_slots = std::max<int32_t>(fc.answer_slots, 2);
    Trainer tr(model, fc, TrainerData::ShapesOnly);
    TrainingProgram & prog = tr;
    RunPlan r;
    // Unpacked preference pairs: batch_size pairs, two sequences each (packed: batch_size sequences of pairs)
    const int64_t group = options.group > 0 ? options.group : fc.preference && !options.packed ? 2 : 1;
    r.step = micro_batch_shapes(seq_len, o.batch * group, micro_batches, options.packed, group);

    HostMemoryPlan & h = r.host;
    // A weight with an fp32 master (full finetune) has its mapped pages released once copied (trainer.cpp).
    std::set<std::string> mastered;
    for (const auto & p : prog.param_infos()) h.masters += p.n * sizeof(float), mastered.insert(p.name);
    for (const Tensor * t : model.weights())
        if (!mastered.count(t->name)) h.mapped_weights += t->nbytes();
    h.gradients = h.masters;
    for (const auto & ti : prog.layer_tensors(prog.num_layers() - 1))  // a trainable tied head's second gradient slot
        if (ti.param >= 0 && model.tied_output() && ti.name == model.tok_embd->name) h.gradients += ti.bytes;
    const size_t states = o.optimizer.kind == OptimizerKind::AdamW ? 2 : o.optimizer.sgd.momentum != 0 ? 1 : 0;
    h.optimizer = states * (o.optimizer.bf16_state ? h.masters / 2 : h.masters);

    const auto rules = footprint_rules(backend);
    CallPlanner planner(prog, *rules);
    if (devices <= 0) {  // the host path: every layer's input kept, one program at a time
        for (MicroBatchInfo & mb : r.step) mb.token_chunk = o.finetune.token_chunk;
        const int L = prog.num_layers();
        // (the layer inputs, and the backward's two gradient buffers)
        for (const MicroBatchInfo & mb : r.step)
            h.checkpoints = std::max(h.checkpoints, static_cast<size_t>(L - 1) * tr.host_input_bytes(mb) + 2 * prog.hidden_bytes(mb));
        const ProgramFootprints & fp = planner.footprints(r.step);
        // accumulate(): decoder layers 1.. keep what their backward reads of their forward while it fits (each
        // half's other nodes run in the shared buffer, beside the layers kept so far); the embedding's programs
        // run before the first and after the last kept one, the head and the other layers' programs beside them all.
        size_t kept = 0;
        int n_kept = 0;
        std::vector<Trainer::KeptBytes> kb(static_cast<size_t>(L));
        if (KeptLayerBudget(o.finetune).open()) {
            std::vector<size_t> layer_kept;
            for (int l = 1; l < L - 1; ++l) {
                for (const MicroBatchInfo & mb : r.step) {
                    const Trainer::KeptBytes b = tr.kept_layer_bytes(l, mb);
                    kb[static_cast<size_t>(l)].kept = std::max(kb[static_cast<size_t>(l)].kept, b.kept);
                    kb[static_cast<size_t>(l)].scratch = std::max(kb[static_cast<size_t>(l)].scratch, b.scratch);
                }
                layer_kept.push_back(kb[static_cast<size_t>(l)].kept);
            }
            n_kept = static_cast<int>(kept_activation_layers(layer_kept, o.finetune.activation_memory, &kept));
        }
        size_t peak = std::max(fp.forward[0], fp.backward[0]);
        size_t so_far = 0;
        for (int l = 1; l <= n_kept; ++l) {
            so_far += kb[static_cast<size_t>(l)].kept;
            peak = std::max(peak, so_far + kb[static_cast<size_t>(l)].scratch);
        }
        size_t beside = fp.head;
        for (int l = 1 + n_kept; l < L - 1; ++l)
            beside = std::max({beside, fp.forward[static_cast<size_t>(l)], fp.backward[static_cast<size_t>(l)]});
        h.kept_activations = kept;
        h.kept_layers = n_kept;
        h.graph = std::max(peak, kept + beside);
        return r;
    }

    CallPlanRequest req;
    req.schedule = o.pipeline.schedule;
    req.grain = o.pipeline.grain;
    req.plan = o.pipeline.plan;
    req.devices = devices;
    // Each device's arena in whole 256-byte units; mixed sizes: the planner restricts stages to the devices that
    // hold them (call_planner.h).
    const std::vector<size_t> sizes =
        o.devices.memories.empty() ? std::vector<size_t>(static_cast<size_t>(devices), o.devices.memory_each) : o.devices.memories;
    if (sizes.size() != static_cast<size_t>(devices))
        throw Error("devices.memories: " + std::to_string(sizes.size()) + " memory sizes for " + std::to_string(devices) + " devices (devices.count)");
    req.device_memory = SIZE_MAX;
    for (size_t d = 0; d < sizes.size(); ++d) {
        const size_t bytes = sizes[d] - sizes[d] % kBufferAlign;
        if (bytes == 0)
            throw Error("devices.memories: " + backend + ":" + std::to_string(d) + " has no memory size (a plan needs every device's; a GPU's free memory is known only when the run opens it)");
        if (bytes < req.device_memory) req.device_memory = bytes, req.device_name = backend + ":" + std::to_string(d);
        req.device_memories.push_back(bytes);
        req.device_names.push_back(backend + ":" + std::to_string(d));
    }
    if (std::all_of(req.device_memories.begin(), req.device_memories.end(), [&](size_t b) { return b == req.device_memory; })) {
        req.device_memories.clear();
        req.device_names.clear();
    }
    r.device_names = req.device_names;
    req.token_chunk = o.pipeline.token_chunk;
    req.resident = o.pipeline.resident_weights;
    req.vocab_on_host = o.pipeline.vocab_on_host;
    r.min_device_peak = planner.least_memory(req, r.step).peak();
    if (options.max_seq_limit > 0) {
        int64_t widest = 0;
        for (const MicroBatchInfo & mb : r.step) widest = std::max(widest, mb.n_seq);
        r.max_seq = planner.max_seq_len(req, widest, static_cast<int>(r.step.size()), options.max_seq_limit);
    }
    r.call = planner.plan(req, r.step);
    // Sync steps upload the masters and sum each parameter's gradient in place in its highest layer's slot;
    // async steps keep pinned copies of both (host_store.h).
    const HostStoreBytes store = host_store_bytes(prog, !o.pipeline.async);
    h.working_copies = store.working;
    h.grad_slots = store.slots;
    const bool copies = o.pipeline.frozen_pinning.value_or(default_frozen_pinning(backend != "cpu")) == FrozenPinning::Copy;
    std::set<std::string> frozen_seen;  // a tensor two layers share (a tied head) is copied once
    for (int l = 0; l < prog.num_layers(); ++l)
        for (const auto & ti : prog.layer_tensors(l))
            if (ti.param < 0 && copies && frozen_seen.insert(ti.name).second) h.frozen_copies += ti.bytes;
    // The calls in flight: async steps overlap the next step's forward with this one's backward (two calls'
    // buffers); a sync step returns them to the pool before the next call (pipeline.cpp step()).
    h.calls_in_flight = o.pipeline.async ? 2 : 1;
    h.boundary = o.finetune.boundary_type;
    h.checkpoints = static_cast<size_t>(h.calls_in_flight) * host_call_bytes(prog, r.call->plan, r.step).total();
    if (backend == "cpu")
        for (int d = 0; d < devices; ++d) h.cpu_devices += r.call->regions_of(d).peak();
    std::vector<MicroBatchInfo> ran = r.step;  // as the call runs them
    for (MicroBatchInfo & mb : ran) r.call->apply(mb);
    r.link = link_bytes(prog, r.call->plan, o.pipeline.schedule, ran, r.call->shape.resident);
    return r;
}

std::string HostMemoryPlan::describe() const {
    const std::pair<const char *, size_t> regions[] = {
        {"mapped weights", mapped_weights},  {"trainable fp32", masters},     {"gradients", gradients},
        {"optimizer state", optimizer},      {"working copies", working_copies}, {"frozen weights copy", frozen_copies},
        {"gradient slots", grad_slots},      {"checkpoints", checkpoints},    {"CPU devices", cpu_devices},
        {"graphs", graph}};
    std::string s;
    for (const auto & [name, bytes] : regions) {
        if (!bytes) continue;
        if (!s.empty()) s += " + ";
        s += std::string(name) + " " + human_bytes(bytes);
    }
    return s;
}

FrozenPinning choose_frozen_pinning(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit) {
    const SessionOptions & o = options.session;
    if (o.pipeline.frozen_pinning) return *o.pipeline.frozen_pinning;
    const FrozenPinning def = default_frozen_pinning(o.devices.backend != "cpu");
    if (!o.pipelined || def != FrozenPinning::Copy) return def;
    RunPlanOptions copy = options;
    copy.session.pipeline.frozen_pinning = FrozenPinning::Copy;
    copy.max_seq_limit = 0;
    try {
        const HostMemoryPlan h = plan_run(model, copy).host;
        return in_use + h.total() <= limit ? FrozenPinning::Copy : FrozenPinning::Register;
    } catch (const MemoryError &) {
        return FrozenPinning::Copy;  // the devices cannot hold the plan: the session says so
    }
}

int64_t host_fitting_token_chunk(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit) {
    if (!options.session.pipelined || options.session.pipeline.token_chunk != -1) return -1;
    RunPlanOptions o = options;
    o.max_seq_limit = 0;
    std::optional<RunPlan> chosen;
    try {
        chosen = plan_run(model, o);
    } catch (const MemoryError &) {
        return -1;  // the devices cannot hold it: the session says so
    }
    if (in_use + chosen->host.total() <= limit || !chosen->call) return -1;
    CallPlanRequest req;
    req.token_chunk = -1;
    for (const int64_t chunk : CallPlanner::chunk_candidates(req, chosen->step)) {
        if (chunk <= 0 || chunk == chosen->call->token_chunk) continue;
        o.session.pipeline.token_chunk = chunk;
        try {
            if (in_use + plan_run(model, o).host.total() <= limit) return chunk;
        } catch (const MemoryError &) {
            // (this chunk's plan does not fit the devices: a smaller one may)
        }
    }
    return -1;
}

size_t require_host_memory(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit,
                           const std::string & limit_source) {
    // The host bytes of the plan at seq_len n, or nullopt when its devices cannot hold it.
    auto host_bytes = [&](int64_t n) -> std::optional<HostMemoryPlan> {
        RunPlanOptions o = options;
        o.seq_len = n;
        o.max_seq_limit = 0;
        try {
            return plan_run(model, o).host;
        } catch (const MemoryError &) {
            return std::nullopt;
        }
    };
    const std::optional<HostMemoryPlan> h = host_bytes(options.seq_len);
    if (!h) return 0;
    if (in_use + h->total() <= limit) return h->total();
    int64_t lo = 0, hi = options.seq_len - 1;  // the largest seq_len that fits is in [lo, hi] (0: none)
    while (lo < hi) {
        const int64_t mid = hi - (hi - lo) / 2;
        const std::optional<HostMemoryPlan> m = host_bytes(mid);
        if (m && in_use + m->total() <= limit) lo = mid;
        else hi = mid - 1;
    }
    std::string msg = "host memory: the run needs " + human_bytes(h->total()) + " (" + h->describe() + ")";
    if (in_use) msg += " beside the " + human_bytes(in_use) + " this process holds";
    msg += ", more than the " + human_bytes(limit) + " it may take (" + limit_source + "). ";
    if (lo > 0) {
        msg += "The largest seq_len that fits is " + std::to_string(lo) + " (same batch_size)";
    } else {
        const std::optional<HostMemoryPlan> one = host_bytes(1);
        msg += "No seq_len fits at this batch_size";
        if (one) msg += ": even seq_len 1 needs " + human_bytes(one->total()) + " (" + one->describe() + ")";
    }
    // A pipeline's checkpoints in bf16 (half their bytes; other results: FinetuneConfig::boundary_type).
    if (h->calls_in_flight > 0 && options.session.finetune.boundary_type == DType::F32) {
        RunPlanOptions o = options;
        o.session.finetune.boundary_type = DType::BF16;
        o.max_seq_limit = 0;
        try {
            if (const HostMemoryPlan b = plan_run(model, o).host; in_use + b.total() <= limit)
                msg += "; with boundary_type bf16 (the checkpoints in half the bytes) it needs " + human_bytes(b.total()) + " and fits";
        } catch (const MemoryError &) {
            // (the devices cannot hold the bf16 plan either: no hint)
        }
    }
    throw MemoryError(msg, in_use + h->total(), limit, lo);
}

std::string RunPlan::report() const {
    std::string s;
    if (call) {
        s += "plan: " + call->plan.describe() + " (" + std::to_string(call->plan.num_stages()) + " stages)\n";
        s += "token chunk: " + std::to_string(call->token_chunk) + (call->token_chunk == 0 ? " (every token in one graph)" : " tokens") +
             ", activation sets per stage: " + std::to_string(call->shape.sets) + "\n";
        for (const std::string & n : call->plan.notes) s += "note: " + n + "\n";
        s += line("device peak", call->memory.peak(), "= " + call->memory.describe());
        // Mixed memory: each device's own peak and the stages it may run.
        const std::vector<StageDesc> stages = plan_stages(call->plan);
        for (size_t d = 0; d < device_names.size(); ++d) {
            const DeviceMemoryPlan & m = call->regions_of(static_cast<int>(d));
            std::string runs;
            for (size_t k = 0; k < stages.size(); ++k)
                if (!call->devices_of_stage(static_cast<int>(k)) || (*call->devices_of_stage(static_cast<int>(k)))[d])
                    runs += (runs.empty() ? "" : " ") + stages[k].name;
            s += line("device " + device_names[d] + " peak", m.peak(), "(runs " + (runs.empty() ? std::string("no stage") : runs) + ")");
        }
        s += line("device min peak", min_device_peak,
                  "(the least any plan takes: one layer per stage, the smallest token chunk, one activation set, the embedding and "
                  "head matrices on the host when they may be)");
    }
    s += line("host peak", host.total());
    s += line("  mapped weights", host.mapped_weights);
    s += line("  trainable fp32", host.masters);
    s += line("  gradients", host.gradients);
    s += line("  optimizer state", host.optimizer);
    if (call) {
        s += line("  working copies (pinned)", host.working_copies);
        if (host.frozen_copies) s += line("  frozen weights (pinned copy)", host.frozen_copies);
        s += line("  gradient slots (pinned)", host.grad_slots);
        s += line("  boundary checkpoints (pinned, " + std::string(dtype_name(host.boundary)) + ", " + std::to_string(host.calls_in_flight) +
                      (host.calls_in_flight == 1 ? " call" : " calls") +
                      " in flight)",
                  host.checkpoints);
        if (host.cpu_devices) s += line("  CPU devices (host RAM, each its planned peak)", host.cpu_devices);
        s += line("link per step", link.total(),
                  "(weights up " + format_bytes(link.weights_up) +
                      (link.vocab_rows_up ? ", embedding rows and head ranges " + format_bytes(link.vocab_rows_up) : std::string()) +
                      ", gradients down " + format_bytes(link.grads_down) +
                      ", activations up " + format_bytes(link.activations_up) + ", down " + format_bytes(link.activations_down) + ")");
        if (link.resident_once) s += line("link once per device", link.resident_once, "(the resident frozen weights, before the first job)");
    } else {
        s += line("  layer inputs", host.checkpoints);
        std::string kept = "(the largest program; every layer recomputed in the backward)";
        if (host.kept_layers > 0)
            kept = std::string("(").append(std::to_string(host.kept_layers)).append(" layers keep their activations: ")
                       .append(format_bytes(host.kept_activations)).append("; the others are recomputed in the backward)");
        s += line("  graphs", host.graph, kept);
    }
    if (max_seq >= 0) s += "max seq: " + std::to_string(max_seq) + "\n";
    return s;
}

} // namespace rp
