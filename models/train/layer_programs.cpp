#include "models/train/layer_program.h"

#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace rp {

namespace {

void check_memory(const std::string & layer, const LayerMemory & mem, size_t n, bool with_grads) {
    if (mem.data.size() != n || (with_grads && mem.grad.size() != n))
        throw Error("layer " + layer + ": memory for " + std::to_string(mem.data.size()) + " tensors, the layer has " + std::to_string(n));
}

} // namespace

Trainer::Bound Trainer::bind(Context & ctx, int layer, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb) const {
    const std::vector<SeqTensor> & list = seq_tensors(layer);
    check_memory(layer_name(layer), mem, list.size(), with_grads);
    std::unordered_map<const Tensor *, Tensor *> map;
    Bound b;
    for (size_t i = 0; i < list.size(); ++i) {
        const Tensor * src = list[i].t;
        Tensor * d = ctx.new_tensor(src->type, src->ne);
        d->name = src->name;
        if (with_grads && list[i].param >= 0) {
            set_param(ctx, d);
            b.params.push_back(d);
        }
        map[src] = d;
        b.by_seq.push_back(d);
    }
    auto m = [&](Tensor * t) -> Tensor * {
        if (!t) return nullptr;
        const auto it = map.find(t);
        return it == map.end() ? nullptr : it->second;
    };
    b.w.tok_embd = m(w_.tok_embd);
    b.w.output_norm = m(w_.output_norm);
    b.w.output = m(w_.output);
    if (layer >= 1 && layer <= static_cast<int>(w_.layers.size())) {
        const LayerWeights & l = w_.layers[static_cast<size_t>(layer - 1)];
        b.layer = l;
        for (Tensor ** s : b.layer.slots()) *s = m(*s);
    }
    for (const SeqTensor & st : list)
        if (const std::vector<LoraDelta> * ds = lora_.find(st.t))
            for (const LoraDelta & d : *ds) b.lora.add(m(st.t), {m(d.a), m(d.b), d.scale});
    // LoRA dropout in training mode only (an evaluation or a reference pass sees the whole adapter, as the
    // whole-model graphs of loss() and sequence_logps() do)
    b.lora.dropout = {mb.training ? cfg_.lora_dropout : 0.0f, cfg_.seed, mb.step, mb.seq_offset, mb.seq_len};
    return b;
}

void position_values(const MicroBatchInfo & mb, std::vector<int32_t> & pos, std::vector<int32_t> & first) {
    if (!mb.packed) {
        pos.resize(static_cast<size_t>(mb.seq_len));
        for (int64_t t = 0; t < mb.seq_len; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
        first.clear();
        return;
    }
    const size_t n = static_cast<size_t>(mb.tokens());
    pos.assign(n, 0);  // a runner that only measures needs the shapes alone
    first.assign(n, 0);
    if (mb.positions) {
        pos.assign(mb.positions, mb.positions + n);
        packed_key_starts(pos.data(), mb.seq_len, mb.n_seq, first.data());
    }
}

bool Trainer::ProgramKey::operator<(const ProgramKey & o) const {
    return std::tie(kind, layer, seq_len, n_seq, token_chunk, packed, vocab_on_host, vocab_pass_once, step, seq_offset, scale_bits) <
           std::tie(o.kind, o.layer, o.seq_len, o.n_seq, o.token_chunk, o.packed, o.vocab_on_host, o.vocab_pass_once, o.step, o.seq_offset,
                    o.scale_bits);
}

Trainer::ProgramKey Trainer::program_key(ProgramKind kind, int layer, const MicroBatchInfo & mb, bool kept) const {
    ProgramKey k;
    k.kind = kept ? -1 : static_cast<int>(kind);
    k.layer = layer;
    k.seq_len = mb.seq_len;
    k.n_seq = mb.n_seq;
    k.token_chunk = mb.token_chunk;
    k.packed = mb.packed;
    k.vocab_on_host = mb.vocab_on_host;
    k.vocab_pass_once = mb.vocab_pass_once;
    // What else the graphs' op parameters hold: LoRA dropout's mask keys (step, sequence offset) and the MoE
    // load-balancing scale of backward graphs (from the loss scale). The head's loss scale is set at each
    // call instead (set_lm_head_ce_loss_scale).
    if (cfg_.lora_dropout > 0.0f) {
        k.step = mb.step;
        k.seq_offset = mb.seq_offset;
    }
    if (cfg_.moe_aux_loss > 0.0f && (kept || kind == ProgramKind::Backward)) k.scale_bits = std::bit_cast<uint32_t>(mb.loss_scale);
    return k;
}

std::unique_ptr<Trainer::Program> Trainer::take_program(const ProgramKey & key) {
    std::lock_guard<std::mutex> lk(programs_m_);
    const auto it = programs_.find(key);
    if (it == programs_.end()) return nullptr;
    std::unique_ptr<Program> p = std::move(it->second);
    programs_.erase(it);
    return p;
}

void Trainer::give_back(const ProgramKey & key, std::unique_ptr<Program> p) {
    std::lock_guard<std::mutex> lk(programs_m_);
    if (programs_.size() >= kMaxCachedPrograms) programs_.clear();  // shapes that keep changing: bound it
    programs_.emplace(key, std::move(p));
}

bool Trainer::replays() const {
    // With LoRA dropout every micro-batch's graphs hold their own masks' keys (step, sequence offset): none
    // would ever be replayed.
    return cfg_.replay_graphs && cfg_.lora_dropout == 0.0f;
}

size_t Trainer::cached_programs() const {
    std::lock_guard<std::mutex> lk(programs_m_);
    return programs_.size() + kept_cache_.size();
}

void Trainer::rebind(Program & p, const LayerMemory & mem, const CallArgs & a) {
    Bound & b = p.b;
    check_memory(layer_name(p.layer), mem, b.by_seq.size(), p.grads);
    for (size_t i = 0; i < b.by_seq.size(); ++i) {
        b.by_seq[i]->data = mem.data[i];
        if (p.grads && b.by_seq[i]->grad) b.by_seq[i]->grad->data = mem.grad[i];
    }
    for (const Program::ArgLeaf & l : p.args) (l.grad ? l.t->grad->data : l.t->data) = a.at(l.arg, l.offset);
}

void Trainer::run_program(Program & p, const LayerMemory & mem, const CallArgs & a_in, const MicroBatchInfo & mb, ProgramContext & pc) {
    CpuGraphRunner host(nullptr, &host_graphs_);
    GraphRunner & runner = pc.runner ? *pc.runner : host;
    // What the graphs keep across them (a streamed head's state), held until the program's end.
    struct Held {
        GraphRunner * r = nullptr;
        ~Held() {
            if (r) r->release_held();
        }
    } held;
    CallArgs a = a_in;
    if (p.held_bytes > 0) {
        a.held = runner.hold(p.held_bytes);
        held.r = &runner;
    }
    rebind(p, mem, a);
    // A piece of a vocabulary matrix on the host, for one graph (Program::Upload): a range of its bytes, or the
    // rows of the micro-batch's tokens gathered on the host (with their lookup ids 0 .. n-1). A runner that only
    // measures gets the sizes alone.
    auto upload_piece = [&](const Program::Upload & u) {
        const char * bytes = static_cast<const char *>(u.from->data);
        const bool values = runner.computes();
        if (values && !bytes) throw Error(describe(u.from) + ": left on the host, but bound to no host bytes");
        if (!u.ids) {
            u.leaf->data = runner.upload(values ? bytes + u.offset : nullptr, u.bytes);
            return;
        }
        const size_t row = u.from->nb[1];
        const int64_t n = u.leaf->ne[1], rows = u.from->ne[1];
        std::vector<char> gathered(values ? static_cast<size_t>(n) * row : 0);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) {
            ids[static_cast<size_t>(t)] = static_cast<int32_t>(t);
            if (!values) continue;
            if (!mb.token_ids) throw Error("embedding: its rows stay on the host, but the micro-batch has no host token ids");
            const int32_t id = mb.token_ids[t];
            if (id < 0 || id >= rows)
                throw Error("embedding: token id " + std::to_string(id) + " at position " + std::to_string(t) + " is outside [0, " +
                            std::to_string(rows) + ")");
            std::memcpy(gathered.data() + static_cast<size_t>(t) * row, bytes + static_cast<size_t>(id) * row, row);
        }
        u.leaf->data = runner.upload(values ? gathered.data() : nullptr, static_cast<size_t>(n) * row);
        u.ids->data = runner.upload(ids.data(), ids.size() * sizeof(int32_t));
    };
    std::vector<int32_t> pos, first;
    position_values(mb, pos, first);
    for (Program::Step & s : p.steps) {
        set_lm_head_ce_loss_scale(s.g, mb.loss_scale);
        set_preference_loss_scale(s.g, mb.loss_scale);
        for (const Program::Zero & z : s.zeros) runner.zero(a.at(z.arg, z.offset), z.bytes);
        if (Tensor * v = s.sequence_values) {
            // (a runner that only measures gets no values: the shape alone)
            const size_t n = static_cast<size_t>(v->nelements());
            std::vector<float> none;
            if (!mb.sequence_values) none.assign(n, 0.0f);
            v->data = runner.upload(mb.sequence_values ? mb.sequence_values : none.data(), n * sizeof(float));
        }
        if (Tensor * ids = s.answer_slots) {
            std::vector<int32_t> slot_ids(static_cast<size_t>(mb.tokens()), 0);  // (a runner that only measures: zeros)
            if (mb.positions) answer_slot_ids(mb.positions, mb.seq_len, mb.n_seq, cfg_.answer_slots, slot_ids.data());
            ids->data = runner.upload(slot_ids.data(), slot_ids.size() * sizeof(int32_t));
        }
        for (const TokenPositions & tp : s.positions) {
            tp.pos->data = runner.upload(pos.data(), pos.size() * sizeof(int32_t));
            if (tp.key_start) tp.key_start->data = runner.upload(first.data(), first.size() * sizeof(int32_t));
        }
        for (const Program::Upload & u : s.uploads) upload_piece(u);
        // (the graph's plan is made at its first run and kept with it: runner.run_planned)
        note_graph_bytes(runner.run_planned(s.g, s.plan, pc.n_threads, [&] {
            for (const Program::Copy & c : s.copies) runner.copy_out(a.at(c.arg, c.offset), c.node);
        }));
    }
}

template <class Build>
void Trainer::call_program(ProgramKind kind, int layer, const LayerMemory & mem, bool grads, const CallArgs & args, const MicroBatchInfo & mb,
                           ProgramContext & pc, Build build) {
    // A runner that only measures builds the graphs of distinct shapes only (token_ranges): never replayed.
    // (A program may replay on another device than the one it was built on: the CPU runners share their plans'
    // rules, and the CUDA runner plans every run itself.)
    const bool replay = replays() && (!pc.runner || pc.runner->computes());
    const ProgramKey key = program_key(kind, layer, mb, false);
    std::unique_ptr<Program> p = replay ? take_program(key) : nullptr;
    if (!p) {
        p = std::make_unique<Program>(*this, layer, mem, grads, mb);
        build(*p);
    }
    run_program(*p, mem, args, mb, pc);
    if (replay) give_back(key, std::move(p));
}

namespace {

// The token ranges of a chunked program: [t0, t1) over the micro-batch's tokens flattened (sequence-major, as
// [n_embd, T, B] lies in memory); one range of every token when chunk is 0 or not smaller.
// A runner that only measures gets the ranges whose graphs differ: the first two (a head's first range
// writes the loss, the others add to it) and the last (it may be shorter).
std::vector<std::pair<int64_t, int64_t>> token_ranges(const MicroBatchInfo & mb, const GraphRunner * runner) {
    const int64_t n = mb.tokens(), c = mb.token_chunk > 0 && mb.token_chunk < n ? mb.token_chunk : n;
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int64_t t0 = 0; t0 < n; t0 += c) {
        if (runner && !runner->computes() && r.size() >= 2 && t0 + c < n) continue;
        r.push_back({t0, std::min(n, t0 + c)});
    }
    return r;
}

} // namespace

// Token-chunked programs: the attention half of decoder layer `layer` (its output, residual included) over
// every token, copied into buffer dst.
void Trainer::attention_half_into(Program & p, int layer, Arg dst, const MicroBatchInfo & mb) {
    const HParams & hp = model_.hparams();
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    Program::Step & s = p.new_step();
    Tensor * h = attention_block(p.ctx, hp, p.b.layer, layer - 1, p.boundary_in(Arg::In, 0, E, T, B), p.positions(s, mb), &p.b.lora,
                                 nullptr, cfg_.attention_type);
    h->flags |= kFlagOutput;
    build_forward(s.g, h);
    s.copies.push_back({dst, 0, h});
}

void Trainer::forward(int layer, const LayerMemory & mem, const void * in, void * out, const MicroBatchInfo & mb,
                      ProgramContext & pc) {
    CallArgs a;
    a.in = in;
    a.out = out;
    call_program(ProgramKind::Forward, layer, mem, false, a, mb, pc, [&](Program & p) {
        const HParams & hp = model_.hparams();
        const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
        const auto ranges = token_ranges(mb, pc.runner);
        if (layer == 0 || ranges.size() == 1) {
            Program::Step & s = p.new_step();
            Tensor * y = nullptr;
            if (layer == 0) {
                Tensor * looked_up = nullptr;
                if (vocab_on_host(p, mb, w_.tok_embd)) {  // the rows of the micro-batch's tokens, gathered on the host
                    const Tensor * table = p.b.w.tok_embd;
                    Tensor * rows = p.ctx.new_tensor(table->type, table->ne[0], T * B);
                    Tensor * ids = p.ctx.new_tensor(DType::I32, T, B);
                    rows->flags |= kFlagInput;
                    ids->flags |= kFlagInput;
                    s.uploads.push_back({rows, table, 0, 0, ids});
                    looked_up = get_rows(p.ctx, rows, ids);
                }
                y = build_embedding(p.ctx, hp, p.b.w.tok_embd, p.leaf(DType::I32, Arg::In, 0, T, B), &p.b.lora, looked_up);
            } else {
                y = build_layer(p.ctx, hp, p.b.layer, layer - 1, p.boundary_in(Arg::In, 0, E, T, B), p.positions(s, mb), &p.b.lora,
                                nullptr, cfg_.attention_type);
            }
            y = p.boundary_out(y);
            y->flags |= kFlagOutput;
            build_forward(s.g, y);
            s.copies.push_back({Arg::Out, 0, y});
            return;
        }
        // Token-chunked: the attention half over every token into `out` (f32), then the feed-forward half range by
        // range in place (each graph reads its range of `out` and its result is copied back over it). A narrower
        // boundary type packs the results from the start of `out`: range [t0, t1)'s lands on bytes that held f32
        // tokens before t1, which this and the earlier graphs have read.
        attention_half_into(p, layer, Arg::Out, mb);
        for (const auto & [t0, t1] : ranges) {
            p.b.lora.dropout.token_offset = t0;
            Program::Step & s = p.new_step();
            Tensor * y = ffn_block(p.ctx, hp, p.b.layer, layer - 1, p.leaf(DType::F32, Arg::Out, token_offset_bytes(t0, E), E, t1 - t0), &p.b.lora);
            y = p.boundary_out(y);
            y->flags |= kFlagOutput;
            build_forward(s.g, y);
            s.copies.push_back({Arg::Out, p.boundary_offset(t0, E), y});
        }
    });
}

void Trainer::head(const LayerMemory & mem, const void * in, const int32_t * labels, float * loss, void * din,
                   const MicroBatchInfo & mb, ProgramContext & pc) {
    CallArgs a;
    a.in = in;
    a.labels = labels;
    a.loss = loss;
    a.din = din;
    if (cfg_.preference) {
        if (!mb.sequence_values && (!pc.runner || pc.runner->computes()))
            throw Error("head: a preference objective needs each sequence's reference, tokens and NLL weight (sequence_values)");
        call_program(ProgramKind::Head, num_layers() - 1, mem, true, a, mb, pc, [&](Program & p) { build_preference_head(p, mb); });
        return;
    }
    if (cfg_.grpo) {
        if (!mb.sequence_values && (!pc.runner || pc.runner->computes()))
            throw Error("head: GRPO needs each token's advantage, log-probabilities and weight (sequence_values)");
        call_program(ProgramKind::Head, num_layers() - 1, mem, true, a, mb, pc, [&](Program & p) { build_grpo_head(p, mb); });
        return;
    }
    call_program(ProgramKind::Head, num_layers() - 1, mem, true, a, mb, pc, [&](Program & p) {
        const int64_t E = model_.hparams().n_embd;
        // One graph per token range (one range unless chunked): forward, loss and backward of its tokens, the
        // parameter gradients accumulating across ranges, the loss summed range by range into *loss.
        const auto ranges = token_ranges(mb, pc.runner);
        // A head on the host folds its rows first: into every token range's state at once (vocab_pass_once), or
        // before each token range's loss.
        const std::vector<Tensor *> states =
            mb.vocab_pass_once && ranges.size() > 1 ? head_ranges_once(p, mb, pc.runner, ranges, true) : std::vector<Tensor *>{};
        for (size_t r = 0; r < ranges.size(); ++r) {
            const auto [t0, t1] = ranges[r];
            const int64_t n = t1 - t0;
            Tensor * state = states.empty() ? head_ranges(p, mb, pc.runner, t0, n, true) : states[r];
            Program::Step & s = p.new_step();
            Tensor * x = ranges.size() == 1 ? p.boundary_param(s, Arg::In, 0, Arg::Din, E, mb.seq_len, mb.n_seq)
                                            : p.boundary_param(s, Arg::In, t0, Arg::Din, E, n, 1);
            Tensor * l = head_loss(p, p.as_f32(x), p.leaf(DType::I32, Arg::Labels, static_cast<size_t>(t0) * sizeof(int32_t), n), state,
                                   mb.loss_scale, false, true);
            build_forward(s.g, l);
            std::vector<Tensor *> ps = p.b.params;
            ps.push_back(x);
            build_backward(p.ctx, s.g, l, ps);
            Tensor * total = t0 == 0 ? l : add(p.ctx, p.leaf(DType::F32, Arg::Loss, 0, 1), l);
            total->flags |= kFlagOutput;
            build_forward(s.g, total);
            s.copies.push_back({Arg::Loss, 0, total});
        }
    });
}

void Trainer::head_forward(const LayerMemory & mem, const void * in, const int32_t * labels, float * results, const MicroBatchInfo & mb,
                           ProgramContext & pc) {
    CallArgs a;
    a.in = in;
    a.labels = labels;
    a.loss = results;
    call_program(ProgramKind::HeadForward, num_layers() - 1, mem, false, a, mb, pc, [&](Program & p) {
        const int64_t E = model_.hparams().n_embd, T = mb.seq_len, B = mb.n_seq;
        Tensor * state = head_ranges(p, mb, pc.runner, 0, T * B, false);  // (on the host: the rows' graphs first)
        Program::Step & s = p.new_step();
        Tensor * x = p.boundary_in(Arg::In, 0, E, T, B);
        Tensor * labels_leaf = p.leaf(DType::I32, Arg::Labels, 0, T * B);
        const bool per_token = cfg_.preference || cfg_.grpo;
        Tensor * nll = head_loss(p, x, labels_leaf, state, per_token ? 1.0f : mb.loss_scale, per_token, false);
        if (!per_token) {  // the summed token loss, as the head's
            Tensor * l = nll;
            l->flags |= kFlagOutput;
            build_forward(s.g, l);
            s.copies.push_back({Arg::Loss, 0, l});
            return;
        }
        if (cfg_.grpo) {  // each token's log-probability after a 0 where the loss goes
            Tensor * logp = scale(p.ctx, nll, -1.0f);
            logp->flags |= kFlagOutput;
            build_forward(s.g, logp);
            s.zeros.push_back({Arg::Loss, 0, sizeof(float)});
            s.copies.push_back({Arg::Loss, sizeof(float), logp});
            return;
        }
        // Each sequence's (answer slot's) log-probability after a 0 where the loss goes (it needs the reference).
        Tensor * logps = build_answer_logps(p, s.answer_slots, mb, nll);
        logps->flags |= kFlagOutput;
        build_forward(s.g, logps);
        s.zeros.push_back({Arg::Loss, 0, sizeof(float)});
        s.copies.push_back({Arg::Loss, sizeof(float), logps});
    });
}

template <class Reported, class LossOf>
void Trainer::build_valued_head(Program & p, const MicroBatchInfo & mb, int64_t values_per, int64_t n_values, Reported reported, LossOf loss_of) {
    const int64_t E = model_.hparams().n_embd, T = mb.seq_len, B = mb.n_seq;
    Tensor * state = head_ranges(p, mb, nullptr, 0, T * B, true);  // (on the host: the rows' graphs first)
    Program::Step & s = p.new_step();
    Tensor * x = p.boundary_param(s, Arg::In, 0, Arg::Din, E, T, B);
    Tensor * nll = head_loss(p, p.as_f32(x), p.leaf(DType::I32, Arg::Labels, 0, T * B), state, 1.0f, true, true);
    Tensor * rep = reported(s, nll);
    s.sequence_values = p.ctx.new_tensor(DType::F32, values_per, n_values);
    s.sequence_values->flags |= kFlagInput;
    Tensor * loss = loss_of(rep, s.sequence_values);
    loss->flags |= kFlagOutput;
    rep->flags |= kFlagOutput;
    build_forward(s.g, loss);
    std::vector<Tensor *> ps = p.b.params;
    ps.push_back(x);
    build_backward(p.ctx, s.g, loss, ps);
    s.copies.push_back({Arg::Loss, 0, loss});
    s.copies.push_back({Arg::Loss, sizeof(float), rep});
}

void Trainer::build_preference_head(Program & p, const MicroBatchInfo & mb) {
    // Per-token NLL -> each answer's log-probability -> the pairs' loss, and back: every token of an answer gets
    // the gradient of its answer's log-probability (the head's per-token backward).
    build_valued_head(
        p, mb, kSequenceValues, mb.n_seq * cfg_.answer_slots,
        [&](Program::Step & s, Tensor * nll) { return build_answer_logps(p, s.answer_slots, mb, nll); },
        [&](Tensor * logps, Tensor * values) { return preference_loss(p.ctx, logps, values, *cfg_.preference, mb.loss_scale); });
}

void Trainer::build_grpo_head(Program & p, const MicroBatchInfo & mb) {
    // Per-token NLL -> log-probabilities -> GRPO's loss, and back: each completion token gets its own derivative
    // (the head's per-token backward).
    build_valued_head(
        p, mb, kTokenValues, mb.tokens(), [&](Program::Step &, Tensor * nll) { return scale(p.ctx, nll, -1.0f); },
        [&](Tensor * logp, Tensor * values) { return grpo_loss(p.ctx, logp, values, *cfg_.grpo); });
}

Tensor * Trainer::build_answer_logps(Program & p, Tensor *& slot_input, const MicroBatchInfo & mb, Tensor * token_nll) const {
    if (cfg_.answer_slots == 1) return build_sequence_logps(p.ctx, token_nll, mb.seq_len, mb.n_seq);
    if (!mb.packed) throw Error("head: answer slots (" + std::to_string(cfg_.answer_slots) + " per sequence) need packed sequences");
    slot_input = p.ctx.new_tensor(DType::I32, mb.tokens());
    slot_input->flags |= kFlagInput;
    return rp::build_answer_logps(p.ctx, token_nll, slot_input, mb.n_seq, cfg_.answer_slots);
}

bool Trainer::vocab_on_host(const Program & p, const MicroBatchInfo & mb, const Tensor * t) const {
    if (!mb.vocab_on_host || !t) return false;
    const std::vector<SeqTensor> & list = seq_tensors(p.layer);
    for (size_t i = 0; i < list.size(); ++i)
        if (list[i].t == t) return layer_infos_[static_cast<size_t>(p.layer)][i].vocab_rows > 0;
    return false;
}

Tensor * Trainer::head_ranges(Program & p, const MicroBatchInfo & mb, const GraphRunner * runner, int64_t t0, int64_t n, bool grad) {
    if (!vocab_on_host(p, mb, w_.output)) return nullptr;
    const size_t bytes = lm_head_state_layout(model_.hparams().n_embd, n, grad).bytes;
    p.held_bytes = std::max(p.held_bytes, bytes);
    Tensor * state = p.leaf(DType::F32, Arg::Held, 0, static_cast<int64_t>(bytes / sizeof(float)));
    fold_head(p, runner, {{t0, t0 + n}}, {state}, grad);
    return state;
}

std::vector<Tensor *> Trainer::head_ranges_once(Program & p, const MicroBatchInfo & mb, const GraphRunner * runner, const TokenRanges & ranges,
                                                bool grad) {
    if (!vocab_on_host(p, mb, w_.output)) return {};
    // Each token range's state at (t0 / chunk) x one full range's: the ranges are equal but the last (a runner
    // that only measures gets some of them: token_ranges), so the layout is every range's.
    const int64_t E = model_.hparams().n_embd, chunk = ranges.front().second - ranges.front().first;
    const size_t per_range = lm_head_state_layout(E, chunk, grad).bytes;
    std::vector<Tensor *> states;
    for (const auto & [t0, t1] : ranges) {
        const size_t at = static_cast<size_t>(t0 / chunk) * per_range, bytes = lm_head_state_layout(E, t1 - t0, grad).bytes;
        p.held_bytes = std::max(p.held_bytes, at + bytes);
        states.push_back(p.leaf(DType::F32, Arg::Held, at, static_cast<int64_t>(bytes / sizeof(float))));
    }
    fold_head(p, runner, ranges, states, grad);
    return states;
}

void Trainer::fold_head(Program & p, const GraphRunner * runner, const TokenRanges & ranges, const std::vector<Tensor *> & states, bool grad) {
    const HParams & hp = model_.hparams();
    const Tensor * W = p.b.w.output;  // bound to the call's memory: the host bytes
    const int64_t E = hp.n_embd, V = W->ne[1], rows = std::min(cfg_.ce_chunk, V);
    const size_t row = W->nb[1];
    // One graph per range of ce_chunk rows (the op's chunk: the unstreamed head's bits), its rows uploaded for it
    // and folded into each token range's state. A runner that only measures gets the first and the last (the
    // others are the first's shape).
    const bool measures = runner && !runner->computes();
    for (int64_t v0 = 0; v0 < V; v0 += rows) {
        const int64_t nv = std::min(rows, V - v0);
        if (measures && v0 > 0 && v0 + nv < V) continue;
        Program::Step & s = p.new_step();
        Tensor * w_range = p.ctx.new_tensor(W->type, W->ne[0], nv);
        w_range->flags |= kFlagInput;
        s.uploads.push_back({w_range, W, static_cast<size_t>(v0) * row, static_cast<size_t>(nv) * row});
        for (size_t r = 0; r < ranges.size(); ++r) {
            const auto [t0, t1] = ranges[r];
            Tensor * fold = build_head_range(p.ctx, hp, p.b.w, p.boundary_in(Arg::In, t0, E, t1 - t0), w_range,
                                             p.leaf(DType::I32, Arg::Labels, static_cast<size_t>(t0) * sizeof(int32_t), t1 - t0),
                                             states[r], v0, cfg_.ce_chunk, grad);
            fold->flags |= kFlagOutput;
            build_forward(s.g, fold);
        }
    }
}

Tensor * Trainer::head_loss(Program & p, Tensor * x, Tensor * labels, Tensor * state, float loss_scale, bool per_token, bool grad) const {
    const HParams & hp = model_.hparams();
    if (state) return build_head_streamed(p.ctx, hp, p.b.w, x, state, labels, loss_scale, cfg_.ce_chunk, per_token, grad);
    return per_token ? build_head_token_nll(p.ctx, hp, p.b.w, x, labels, cfg_.ce_chunk) : build_loss(p.ctx, p.b.w, x, labels, loss_scale);
}

HParams Trainer::backward_hparams(const MicroBatchInfo & mb) const {
    HParams hp = model_.hparams();
    hp.moe_aux = cfg_.moe_aux_loss * static_cast<float>(hp.n_expert) * mb.loss_scale;
    return hp;
}

void Trainer::backward(int layer, const LayerMemory & mem, const void * in, const void * dout, void * din,
                       const MicroBatchInfo & mb, ProgramContext & pc) {
    if (layer == 0 && !std::any_of(seq_tensors(0).begin(), seq_tensors(0).end(), [](const SeqTensor & st) { return st.param >= 0; }))
        return;  // nothing trainable in the embedding, and ids have no gradient
    CallArgs a;
    a.in = in;
    a.dout = dout;
    a.din = din;
    call_program(ProgramKind::Backward, layer, mem, true, a, mb, pc, [&](Program & p) {
        const HParams hp = backward_hparams(mb);
        const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
        const auto ranges = token_ranges(mb, pc.runner);
        if (layer == 0) {
            Program::Step & s = p.new_step();
            Tensor * e = build_embedding(p.ctx, hp, p.b.w.tok_embd, p.leaf(DType::I32, Arg::In, 0, T, B), &p.b.lora);
            build_forward(s.g, e);
            build_backward(p.ctx, s.g, e, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), p.b.params);
            prune_unused(s.g);  // (the lookup itself: its gradient reads the ids only)
            return;
        }
        auto attention_backward = [&](Tensor * (*whole_layer)(Context &, const HParams &, const LayerWeights &, int, Tensor *,
                                                              const TokenPositions &, const LoraSet *, const LayerKv *, DType)) {
            Program::Step & s = p.new_step();
            Tensor * x = p.boundary_param(s, Arg::In, 0, Arg::Din, E, T, B);
            // (y, not its rounding to the boundary type: that rounding's gradient is the identity)
            Tensor * y = whole_layer(p.ctx, hp, p.b.layer, layer - 1, p.as_f32(x), p.positions(s, mb), &p.b.lora, nullptr, cfg_.attention_type);
            build_forward(s.g, y);
            std::vector<Tensor *> ps = p.b.params;
            ps.push_back(x);
            build_backward(p.ctx, s.g, y, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), ps);
            prune_unused(s.g);  // the recompute stops where the backward stops reading: no y, no last projections
        };
        if (ranges.size() == 1) {
            attention_backward(build_layer);
            return;
        }
        // Token-chunked (dout is the program's scratch from here on: program.h):
        //   1. the attention half's output h into din (din is written last, with the input gradient);
        //   2. per token range: recompute the feed-forward term f(h) (without the residual) and backpropagate
        //      dout through it into the gradient of h, which accumulates in place onto dout: dh = dout + J_f^T dout,
        //      the residual's share being dout itself (each range's dout is read by the first backward nodes and
        //      overwritten by the graph's last one);
        //   3. the attention half again, backpropagating dh (now in dout) into the input gradient din.
        // Graphs 1 and 3 each compute the attention forward: chunking costs one attention forward more.
        attention_half_into(p, layer, Arg::Din, mb);
        for (const auto & [t0, t1] : ranges) {
            p.b.lora.dropout.token_offset = t0;
            Program::Step & s = p.new_step();
            const size_t off = token_offset_bytes(t0, E);
            // (the gradient of h is not zeroed: it holds the residual's share)
            Tensor * h = p.hidden_param(s, Arg::Din, off, Arg::Dout, off, E, t1 - t0, 1, /*zero=*/false);
            Tensor * f = ffn_block(p.ctx, hp, p.b.layer, layer - 1, h, &p.b.lora, /*residual=*/false);
            build_forward(s.g, f);
            std::vector<Tensor *> ps = p.b.params;
            ps.push_back(h);
            build_backward(p.ctx, s.g, f, p.leaf(DType::F32, Arg::Dout, off, E, t1 - t0), ps);
            prune_unused(s.g);
        }
        p.b.lora.dropout.token_offset = 0;
        attention_backward(attention_block);
    });
}

namespace {

// Memory for a program that is built and measured, never run: a null pointer for every tensor of the layer.
LayerMemory untouched_memory(size_t tensors) {
    LayerMemory mem;
    mem.data.assign(tensors, nullptr);
    mem.grad.assign(tensors, nullptr);
    return mem;
}

} // namespace

double Trainer::model_flops(const MicroBatchInfo & mb_in) {
    MicroBatchInfo mb = mb_in;
    mb.token_chunk = 0;
    mb.vocab_on_host = false;  // (a runner that only measures builds some of its row ranges)
    FlopRunner fr;
    ProgramContext pc;
    pc.runner = &fr;
    const int L = num_layers();
    for (int l = 0; l < L - 1; ++l) {
        const LayerMemory mem = untouched_memory(layer_infos_[static_cast<size_t>(l)].size());
        fr.count = FlopRunner::Count::Forward;
        forward(l, mem, nullptr, nullptr, mb, pc);
        fr.count = FlopRunner::Count::Backward;  // (its graphs recompute the forward: not counted)
        backward(l, mem, nullptr, nullptr, nullptr, mb, pc);
    }
    fr.count = FlopRunner::Count::All;
    head(untouched_memory(layer_infos_[static_cast<size_t>(L - 1)].size()), nullptr, nullptr, nullptr, nullptr, mb, pc);
    return fr.flops();
}

size_t Trainer::program_footprint(ProgramKind kind, int layer, const MicroBatchInfo & mb, const GraphRunner & rules) {
    // The program itself, over memory that is never touched: its graphs are built and measured, not run.
    FootprintRunner fr(rules);
    ProgramContext pc;
    pc.runner = &fr;
    const LayerMemory mem = untouched_memory(layer_infos_[static_cast<size_t>(layer)].size());
    switch (kind) {
    case ProgramKind::Forward: forward(layer, mem, nullptr, nullptr, mb, pc); break;
    case ProgramKind::Head: head(mem, nullptr, nullptr, nullptr, nullptr, mb, pc); break;
    case ProgramKind::HeadForward: head_forward(mem, nullptr, nullptr, nullptr, mb, pc); break;
    case ProgramKind::Backward: backward(layer, mem, nullptr, nullptr, nullptr, mb, pc); break;
    }
    return fr.peak();
}

} // namespace rp
