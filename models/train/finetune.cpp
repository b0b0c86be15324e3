#include "models/train/finetune.h"

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

std::vector<std::string> default_lora_targets() {
    return {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
}

std::vector<std::string> expand_lora_targets(const Model & model, const std::vector<std::string> & targets) {
    std::vector<std::string> out;
    for (std::string t : targets) {
        // On a mixture of experts the feed-forward targets name the experts' tensors (the router,
        // ffn_gate_inp, is a target of its own).
        if (model.hparams().is_moe() && (t == "ffn_gate" || t == "ffn_up" || t == "ffn_down")) t += "_exps";
        size_t hits = 0;
        for (const Tensor * w : model.weights()) {
            const std::string & n = w->name;
            const std::string suffix = "." + t + ".weight";
            const bool layer_hit = n.rfind("blk.", 0) == 0 && n.size() > suffix.size() &&
                                   n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
            if (layer_hit || n == t + ".weight") {
                out.push_back(n);
                ++hits;
            }
        }
        if (hits == 0)
            throw Error("lora_targets: unknown target '" + t + "' (no tensor of " + model.path() +
                        " is named like blk.N." + t + ".weight or " + t + ".weight)");
    }
    return out;
}

namespace {

// U[0, 1) from the top 53 bits: the same on every standard library (std::uniform_real_distribution is not).
double unit(std::mt19937_64 & rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// A fresh f32 copy of a weight (the fp32 master of a full finetune); only its shape without `copy`. The
// weight's mapped pages are then dropped from memory: the graphs read the master, and the file's copy would
// stay resident beside it for the whole run (75 MiB of a 20M-parameter f32 model's 470 MiB peak).
Tensor * f32_master(Context & ctx, const Model & model, const Tensor * w, bool copy) {
    Tensor * m = ctx.new_tensor(DType::F32, w->ne);
    m->name = w->name;
    if (!copy) return m;
    ctx.alloc_data(m);
    const std::vector<float> v = tensor_get_f32(w);
    std::memcpy(m->data, v.data(), v.size() * sizeof(float));
    model.file().release_pages(w->data, w->nbytes());
    return m;
}

struct Inputs {
    Tensor * ids;
    Tensor * labels;
    Tensor * pos;
    Tensor * key_start;  // packed sequences only
};

// Inputs in the context's own memory (whole-model graphs: loss() and logits()).
Inputs make_inputs(Context & ctx, const int32_t * ids, const int32_t * labels, int64_t T, int64_t B,
                   const int32_t * positions = nullptr) {
    Inputs in{};
    in.ids = ctx.new_tensor(DType::I32, T, B);
    ctx.alloc_data(in.ids);
    std::memcpy(in.ids->data, ids, static_cast<size_t>(T * B) * sizeof(int32_t));
    if (labels) {
        in.labels = ctx.new_tensor(DType::I32, T * B);
        ctx.alloc_data(in.labels);
        std::memcpy(in.labels->data, labels, static_cast<size_t>(T * B) * sizeof(int32_t));
    }
    if (positions) {
        in.pos = ctx.new_tensor(DType::I32, T * B);
        in.key_start = ctx.new_tensor(DType::I32, T * B);
        ctx.alloc_data(in.pos);
        ctx.alloc_data(in.key_start);
        std::memcpy(in.pos->data, positions, static_cast<size_t>(T * B) * sizeof(int32_t));
        packed_key_starts(positions, T, B, in.key_start->data_as<int32_t>());
    } else {
        in.pos = ctx.new_tensor(DType::I32, T);
        ctx.alloc_data(in.pos);
        for (int64_t t = 0; t < T; ++t) in.pos->data_as<int32_t>()[t] = static_cast<int32_t>(t);
    }
    for (Tensor * t : {in.ids, in.labels, in.pos, in.key_start})
        if (t) t->flags |= kFlagInput;
    return in;
}

} // namespace

Trainer::Trainer(const Model & model, const FinetuneConfig & cfg, TrainerData data) : model_(model), cfg_(cfg) {
    const HParams & hp = model.hparams();
    if (!(cfg.moe_aux_loss >= 0.0f) || !std::isfinite(cfg.moe_aux_loss))
        throw Error("moe_aux_loss " + std::to_string(cfg.moe_aux_loss) + " must be a finite number >= 0");
    if (cfg.moe_aux_loss > 0.0f && !hp.is_moe())
        throw Error("moe_aux_loss: " + model.path() + " is not a mixture of experts (" + hp.arch->name + ")");
    w_ = model.graph_weights();
    const bool alloc = data == TrainerData::Allocate;

    auto add_param = [&](Tensor * t) {
        set_param(ctx_, t);
        if (alloc) ctx_.alloc_data(t->grad);
        params_.push_back({t->name, t});
    };

    if (!(cfg.lora_dropout >= 0.0f && cfg.lora_dropout < 1.0f))
        throw Error("lora_dropout must be in [0, 1), got " + std::to_string(cfg.lora_dropout));
    if (cfg.full) {
        // Every float tensor becomes an fp32 master (quantized ones stay frozen in their dtype).
        for (const std::string & n : cfg.full_tensors)
            if (!model.find(n)) throw Error("full_tensors: the model has no tensor '" + n + "'");
        const std::set<std::string> only(cfg.full_tensors.begin(), cfg.full_tensors.end());
        auto master = [&](Tensor *& slot) {
            if (!slot || !dtype_is_float(slot->type)) return;
            if (!only.empty() && !only.count(slot->name)) return;
            slot = f32_master(ctx_, model, slot, alloc);
            add_param(slot);
        };
        master(w_.tok_embd);
        if (model.tied_output()) {
            w_.output = w_.tok_embd;  // one parameter, two owners (layer 0 and the head), two gradient slots
            if (w_.tok_embd->has_flag(kFlagParam)) {
                head_slot_ = ctx_.new_tensor(DType::F32, w_.tok_embd->ne);
                head_slot_->name = w_.tok_embd->name + ".head_grad";
                if (alloc) ctx_.alloc_data(head_slot_);
            }
        } else {
            master(w_.output);
        }
        master(w_.output_norm);
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            for (Tensor ** s : w_.layers[il].slots()) master(*s);
        }
    } else {
        if (cfg.lora_rank < 1)
            throw Error("lora_rank must be >= 1, got " + std::to_string(cfg.lora_rank));
        const std::vector<std::string> names = expand_lora_targets(model, cfg.lora_targets);
        for (const std::string & n : names)
            if (n == "output.weight")
                throw Error("lora_targets: 'output' (the LM head) cannot carry LoRA on the fused LM-head cross-entropy "
                            "path; train it with a full finetune");
        adapter_ = LoraAdapter::create(model, names, cfg.lora_rank, cfg.lora_alpha, alloc);
        lora_.add(*adapter_);

        // PEFT init: A ~ Kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0. For token_embd PEFT's
        // embedding layer does the opposite (A = 0, B ~ N(0, 1)); with llama.cpp's role swap that is our A = 0 and
        // B normal. One seeded stream in adapter order.
        std::mt19937_64 rng(cfg.seed);
        for (const LoraTensor & t : adapter_->tensors()) {
            if (!alloc) {  // shapes only: no init
                add_param(t.a);
                add_param(t.b);
                continue;
            }
            std::vector<float> a(static_cast<size_t>(t.a->nelements()), 0.0f), b(static_cast<size_t>(t.b->nelements()), 0.0f);
            if (t.embedding) {
                for (float & x : b) {  // Box-Muller
                    const double u1 = 1.0 - unit(rng), u2 = unit(rng);
                    x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
                }
            } else {
                const double bound = 1.0 / std::sqrt(static_cast<double>(t.a->ne[0]));
                for (float & x : a) x = static_cast<float>((2.0 * unit(rng) - 1.0) * bound);
            }
            tensor_set_f32(t.a, a);
            tensor_set_f32(t.b, b);
            add_param(t.a);
            add_param(t.b);
        }
    }

    // The sequential view: every tensor each layer's graphs read, with its parameter index.
    std::unordered_map<const Tensor *, int> param_index;
    for (size_t i = 0; i < params_.size(); ++i) param_index[params_[i].t] = static_cast<int>(i);
    auto push_one = [&](std::vector<SeqTensor> & list, Tensor * t) {
        for (const SeqTensor & e : list)
            if (e.t == t) return;
        const auto it = param_index.find(t);
        list.push_back({t, it == param_index.end() ? -1 : it->second});
    };
    auto push = [&](std::vector<SeqTensor> & list, Tensor * t) {
        if (!t) return;
        push_one(list, t);
        if (const std::vector<LoraDelta> * ds = lora_.find(t))  // the LoRA pairs right after their base
            for (const LoraDelta & d : *ds) {
                push_one(list, d.a);
                push_one(list, d.b);
            }
    };
    seq_.resize(hp.n_layer + 2);
    push(seq_.front(), w_.tok_embd);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        for (Tensor * t : w_.layers[il].tensors()) push(seq_[il + 1], t);
    }
    push(seq_.back(), w_.output_norm);
    push(seq_.back(), w_.output);
}

void Trainer::free_graph_memory() {
    host_graphs_.release();
    kept_graphs_.clear();
}

void Trainer::zero_grads() {
    // In 1 MiB pieces over the threads: one thread's memset streams at about half the machine's write
    // bandwidth (a 20M-parameter full finetune: 10 ms of a 240 ms step on one core).
    constexpr size_t kPiece = size_t(1) << 20;
    std::vector<std::pair<char *, size_t>> pieces;
    auto add = [&](void * data, size_t bytes) {
        for (size_t off = 0; off < bytes; off += kPiece) pieces.push_back({static_cast<char *>(data) + off, std::min(kPiece, bytes - off)});
    };
    for (const Param & p : params_) add(p.t->grad->data, p.t->grad->nbytes());
    if (head_slot_) add(head_slot_->data, head_slot_->nbytes());
    const int64_t n = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; ++i) std::memset(pieces[static_cast<size_t>(i)].first, 0, pieces[static_cast<size_t>(i)].second);
}

void Trainer::collect_grads() {
    if (!head_slot_) return;
    float * g = w_.tok_embd->grad->data_as<float>();
    const float * h = head_slot_->data_as<float>();
    for (int64_t i = 0, n = head_slot_->nelements(); i < n; ++i) g[i] = h[i] + g[i];  // head slot first, as RoundPipe's hand-off
    std::memset(head_slot_->data, 0, head_slot_->nbytes());
}

std::string Trainer::seq_layer_name(int layer) const {
    if (layer == 0) return "embedding";
    if (layer == num_seq_layers() - 1) return "head";
    return "blk." + std::to_string(layer - 1);
}

size_t Trainer::hidden_bytes(const MicroBatchInfo & mb) const {
    return static_cast<size_t>(model_.hparams().n_embd) * static_cast<size_t>(mb.tokens()) * sizeof(float);
}

Tensor * Trainer::build_loss(Context & ctx, const ModelWeights & w, Tensor * x, Tensor * labels, float loss_scale) const {
    return build_head_ce(ctx, model_.hparams(), w, x, labels, loss_scale, cfg_.ce_chunk);
}

// A layer's tensors rebound to memory: copies of the seq tensors in one program's context, the weights struct
// and LoRA set the graph builders read, and the trainable copies (with grads) for build_backward.
struct Trainer::Bound {
    ModelWeights w{};
    LayerWeights layer{};
    LoraSet lora;
    std::vector<Tensor *> params;
    std::vector<Tensor *> by_seq;  // the copy of seq_tensors(layer)[i], pointed at each call's LayerMemory
};

namespace {

void check_memory(const std::string & layer, const LayerMemory & mem, size_t n, bool with_grads) {
    if (mem.data.size() != n || (with_grads && mem.grad.size() != n))
        throw Error("layer " + layer + ": memory for " + std::to_string(mem.data.size()) + " tensors, the layer has " + std::to_string(n));
}

} // namespace

Trainer::Bound Trainer::bind(Context & ctx, int layer, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb) const {
    const std::vector<SeqTensor> & list = seq_tensors(layer);
    check_memory(seq_layer_name(layer), mem, list.size(), with_grads);
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
    b.lora.dropout = {cfg_.lora_dropout, cfg_.seed, mb.step, mb.seq_offset, mb.seq_len};
    return b;
}

// The buffers a per-layer program reads and writes in one call (roundpipe/program.h's arguments).
enum class Trainer::Arg : uint8_t { In, Out, Din, Dout, Labels, Loss };

struct Trainer::CallArgs {
    const void * in = nullptr;
    void * out = nullptr;
    void * din = nullptr;
    const void * dout = nullptr;  // the chunked backward also uses it as scratch (program.h)
    const int32_t * labels = nullptr;
    float * loss = nullptr;
    // Byte `offset` of buffer a. (Integer arithmetic: a runner that only measures passes null buffers.)
    void * at(Arg a, size_t offset) const {
        const void * base = a == Arg::In ? in : a == Arg::Out ? out : a == Arg::Din ? din : a == Arg::Dout ? dout
                            : a == Arg::Labels ? static_cast<const void *>(labels) : static_cast<const void *>(loss);
        return reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(base) + offset);
    }
};

namespace {

size_t token_bytes(int64_t token, int64_t n_embd) { return static_cast<size_t>(token * n_embd) * sizeof(float); }

} // namespace

// A per-layer program: its layer's tensors, and its graphs, built once for a shape (ProgramKey) and replayed
// with every call's memory: leafs over the call's buffers are recorded with their buffer and byte offset, and
// each graph (a Step) with the buffers zeroed before it runs, the positions it reads (uploaded for it: an
// upload lives until the next graph has run) and the results copied out of it.
struct Trainer::Program {
    struct ArgLeaf {
        Tensor * t;
        Arg arg;
        size_t offset;
        bool grad;  // the leaf's gradient buffer (t->grad->data), not its data
    };
    struct Zero {
        Arg arg;
        size_t offset, bytes;
    };
    struct Copy {
        Arg arg;
        size_t offset;
        const Tensor * node;
    };
    struct Step {
        Graph g;
        std::vector<Zero> zeros;
        std::vector<TokenPositions> positions;
        std::vector<Copy> copies;
        AllocPlan plan;  // made at the first run (GraphRunner::run_planned)
    };

    Context ctx;
    int layer;
    Bound b;
    bool grads;
    std::vector<ArgLeaf> args;
    std::deque<Step> steps;  // (references to a step stay valid while later ones are added)

    Program(const Trainer & tr, int layer_index, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb)
        : layer(layer_index), b(tr.bind(ctx, layer_index, mem, with_grads, mb)), grads(with_grads) {}

    Step & new_step() { return steps.emplace_back(); }
    // A leaf over buffer a from byte offset.
    Tensor * leaf(DType type, Arg a, size_t offset, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
        Tensor * t = ctx.new_tensor(type, ne0, ne1, ne2);
        t->flags |= kFlagInput;
        args.push_back({t, a, offset, false});
        return t;
    }
    // A hidden-state leaf that is a parameter of the graph: its gradient goes to buffer g from byte goffset,
    // zeroed before step s runs when `zero` (else it holds what the gradient adds to).
    Tensor * hidden_param(Step & s, Arg a, size_t offset, Arg g, size_t goffset, int64_t ne0, int64_t ne1, int64_t ne2, bool zero = true) {
        Tensor * x = leaf(DType::F32, a, offset, ne0, ne1, ne2);
        set_param(ctx, x);
        args.push_back({x, g, goffset, true});
        if (zero) s.zeros.push_back({g, goffset, static_cast<size_t>(ne0 * ne1 * ne2) * sizeof(float)});
        return x;
    }
    // The micro-batch's token positions as step s reads them (their values: upload_positions). Unpacked:
    // 0 .. T-1, shared by the sequences. Packed: the micro-batch's own positions and each token's first
    // visible key (the start of its example).
    TokenPositions positions(Step & s, const MicroBatchInfo & mb) {
        auto input = [&](int64_t n) {
            Tensor * t = ctx.new_tensor(DType::I32, n);
            t->flags |= kFlagInput;
            return t;
        };
        const TokenPositions tp = mb.packed ? TokenPositions(input(mb.tokens()), input(mb.tokens())) : TokenPositions(input(mb.seq_len));
        s.positions.push_back(tp);
        return tp;
    }
};

namespace {

// The values of positions leafs (Program::positions) for micro-batch mb: pos, and key starts when packed.
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

} // namespace

bool Trainer::ProgramKey::operator<(const ProgramKey & o) const {
    return std::tie(kind, layer, seq_len, n_seq, token_chunk, packed, step, seq_offset, scale_bits) <
           std::tie(o.kind, o.layer, o.seq_len, o.n_seq, o.token_chunk, o.packed, o.step, o.seq_offset, o.scale_bits);
}

Trainer::ProgramKey Trainer::program_key(ProgramKind kind, int layer, const MicroBatchInfo & mb, bool kept) const {
    ProgramKey k;
    k.kind = kept ? 3 : static_cast<int>(kind);
    k.layer = layer;
    k.seq_len = mb.seq_len;
    k.n_seq = mb.n_seq;
    k.token_chunk = mb.token_chunk;
    k.packed = mb.packed;
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

std::unique_ptr<Trainer::Program> Trainer::take_program(const ProgramKey & key) const {
    std::lock_guard<std::mutex> lk(programs_m_);
    const auto it = programs_.find(key);
    if (it == programs_.end()) return nullptr;
    std::unique_ptr<Program> p = std::move(it->second);
    programs_.erase(it);
    return p;
}

void Trainer::give_back(const ProgramKey & key, std::unique_ptr<Program> p) const {
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

void Trainer::rebind(Program & p, const LayerMemory & mem, const CallArgs & a) const {
    Bound & b = p.b;
    check_memory(seq_layer_name(p.layer), mem, b.by_seq.size(), p.grads);
    for (size_t i = 0; i < b.by_seq.size(); ++i) {
        b.by_seq[i]->data = mem.data[i];
        if (p.grads && b.by_seq[i]->grad) b.by_seq[i]->grad->data = mem.grad[i];
    }
    for (const Program::ArgLeaf & l : p.args) (l.grad ? l.t->grad->data : l.t->data) = a.at(l.arg, l.offset);
}

void Trainer::run_program(Program & p, const LayerMemory & mem, const CallArgs & a, const MicroBatchInfo & mb, ProgramContext & pc) const {
    CpuGraphRunner host(nullptr, &host_graphs_);
    GraphRunner & runner = pc.runner ? *pc.runner : host;
    rebind(p, mem, a);
    std::vector<int32_t> pos, first;
    position_values(mb, pos, first);
    for (Program::Step & s : p.steps) {
        set_lm_head_ce_loss_scale(s.g, mb.loss_scale);
        for (const Program::Zero & z : s.zeros) runner.zero(a.at(z.arg, z.offset), z.bytes);
        for (const TokenPositions & tp : s.positions) {
            tp.pos->data = runner.upload(pos.data(), pos.size() * sizeof(int32_t));
            if (tp.key_start) tp.key_start->data = runner.upload(first.data(), first.size() * sizeof(int32_t));
        }
        // (the graph's plan is made at its first run and kept with it: runner.run_planned)
        note_graph_bytes(runner.run_planned(s.g, s.plan, pc.n_threads, [&] {
            for (const Program::Copy & c : s.copies) runner.copy_f32(a.at(c.arg, c.offset), c.node);
        }));
    }
}

template <class Build>
void Trainer::call_program(ProgramKind kind, int layer, const LayerMemory & mem, bool grads, const CallArgs & args, const MicroBatchInfo & mb,
                           ProgramContext & pc, Build build) const {
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

LayerMemory Trainer::host_memory(int layer) const {
    LayerMemory mem;
    const bool head = layer == num_seq_layers() - 1;
    for (const SeqTensor & st : seq_tensors(layer)) {
        mem.data.push_back(st.t->data);
        float * g = nullptr;
        if (st.param >= 0) g = head && head_slot_ && st.t == w_.tok_embd ? head_slot_->data_as<float>() : st.t->grad->data_as<float>();
        mem.grad.push_back(g);
    }
    return mem;
}

void Trainer::note_graph_bytes(size_t graph) const {
    const size_t bytes = graph + kept_live_.load();
    size_t prev = peak_graph_bytes_.load();
    while (bytes > prev && !peak_graph_bytes_.compare_exchange_weak(prev, bytes)) {}
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
void Trainer::attention_half_into(Program & p, int layer, Arg dst, const MicroBatchInfo & mb) const {
    const HParams & hp = model_.hparams();
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    Program::Step & s = p.new_step();
    Tensor * h = attention_block(p.ctx, hp, p.b.layer, layer - 1, p.leaf(DType::F32, Arg::In, 0, E, T, B), p.positions(s, mb), &p.b.lora,
                                 nullptr, cfg_.attention_type);
    h->flags |= kFlagOutput;
    build_forward(s.g, h);
    s.copies.push_back({dst, 0, h});
}

void Trainer::seq_forward(int layer, const LayerMemory & mem, const void * in, void * out, const MicroBatchInfo & mb,
                          ProgramContext & pc) const {
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
                y = build_embedding(p.ctx, p.b.w.tok_embd, p.leaf(DType::I32, Arg::In, 0, T, B), &p.b.lora);
            } else {
                y = build_layer(p.ctx, hp, p.b.layer, layer - 1, p.leaf(DType::F32, Arg::In, 0, E, T, B), p.positions(s, mb), &p.b.lora,
                                nullptr, cfg_.attention_type);
            }
            y->flags |= kFlagOutput;
            build_forward(s.g, y);
            s.copies.push_back({Arg::Out, 0, y});
            return;
        }
        // Token-chunked: the attention half over every token into `out`, then the feed-forward half range by
        // range in place (each graph reads its range of `out` and its result is copied back over it).
        attention_half_into(p, layer, Arg::Out, mb);
        for (const auto & [t0, t1] : ranges) {
            p.b.lora.dropout.token_offset = t0;
            Program::Step & s = p.new_step();
            Tensor * y = ffn_block(p.ctx, hp, p.b.layer, layer - 1, p.leaf(DType::F32, Arg::Out, token_bytes(t0, E), E, t1 - t0), &p.b.lora);
            y->flags |= kFlagOutput;
            build_forward(s.g, y);
            s.copies.push_back({Arg::Out, token_bytes(t0, E), y});
        }
    });
}

void Trainer::seq_head(const LayerMemory & mem, const void * in, const int32_t * labels, float * loss, void * din,
                       const MicroBatchInfo & mb, ProgramContext & pc) const {
    CallArgs a;
    a.in = in;
    a.labels = labels;
    a.loss = loss;
    a.din = din;
    call_program(ProgramKind::Head, num_seq_layers() - 1, mem, true, a, mb, pc, [&](Program & p) {
        const int64_t E = model_.hparams().n_embd;
        // One graph per token range (one range unless chunked): forward, loss and backward of its tokens, the
        // parameter gradients accumulating across ranges, the loss summed range by range into *loss.
        const auto ranges = token_ranges(mb, pc.runner);
        for (const auto & [t0, t1] : ranges) {
            const int64_t n = t1 - t0;
            Program::Step & s = p.new_step();
            Tensor * x = ranges.size() == 1 ? p.hidden_param(s, Arg::In, 0, Arg::Din, 0, E, mb.seq_len, mb.n_seq)
                                            : p.hidden_param(s, Arg::In, token_bytes(t0, E), Arg::Din, token_bytes(t0, E), E, n, 1);
            Tensor * l = build_loss(p.ctx, p.b.w, x, p.leaf(DType::I32, Arg::Labels, static_cast<size_t>(t0) * sizeof(int32_t), n), mb.loss_scale);
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

HParams Trainer::backward_hparams(const MicroBatchInfo & mb) const {
    HParams hp = model_.hparams();
    hp.moe_aux = cfg_.moe_aux_loss * static_cast<float>(hp.n_expert) * mb.loss_scale;
    return hp;
}

void Trainer::seq_backward(int layer, const LayerMemory & mem, const void * in, const void * dout, void * din,
                           const MicroBatchInfo & mb, ProgramContext & pc) const {
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
            Tensor * e = build_embedding(p.ctx, p.b.w.tok_embd, p.leaf(DType::I32, Arg::In, 0, T, B), &p.b.lora);
            build_forward(s.g, e);
            build_backward(p.ctx, s.g, e, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), p.b.params);
            return;
        }
        auto attention_backward = [&](Tensor * (*whole_layer)(Context &, const HParams &, const LayerWeights &, int, Tensor *,
                                                              const TokenPositions &, const LoraSet *, const LayerKv *, DType)) {
            Program::Step & s = p.new_step();
            Tensor * x = p.hidden_param(s, Arg::In, 0, Arg::Din, 0, E, T, B);
            Tensor * y = whole_layer(p.ctx, hp, p.b.layer, layer - 1, x, p.positions(s, mb), &p.b.lora, nullptr, cfg_.attention_type);
            build_forward(s.g, y);
            std::vector<Tensor *> ps = p.b.params;
            ps.push_back(x);
            build_backward(p.ctx, s.g, y, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), ps);
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
            const size_t off = token_bytes(t0, E);
            // (the gradient of h is not zeroed: it holds the residual's share)
            Tensor * h = p.hidden_param(s, Arg::Din, off, Arg::Dout, off, E, t1 - t0, 1, /*zero=*/false);
            Tensor * f = ffn_block(p.ctx, hp, p.b.layer, layer - 1, h, &p.b.lora, /*residual=*/false);
            build_forward(s.g, f);
            std::vector<Tensor *> ps = p.b.params;
            ps.push_back(h);
            build_backward(p.ctx, s.g, f, p.leaf(DType::F32, Arg::Dout, off, E, t1 - t0), ps);
        }
        p.b.lora.dropout.token_offset = 0;
        attention_backward(attention_block);
    });
}

// A decoder layer's forward + backward graph kept between the sweeps of one micro-batch: the graph seq_backward
// would rebuild from the layer's input, planned once into its own buffer. Its forward nodes run in the forward
// sweep (the layer output is copied out as the next layer's input), the others in the backward sweep, so the
// kept activations replace the recompute and the gradients are the recompute path's bits. Built and planned
// once per shape (ProgramKey) and replayed: each micro-batch only points its leafs at that micro-batch's
// buffers and binds the plan (no planning) in the layer's buffer.
struct Trainer::KeptLayer {
    Program p;
    Graph whole, forward, backward;
    // Memory: the forward nodes the backward reads stay in the layer's own buffer between the sweeps (kept, at
    // their offsets; kept_bytes in all); every other node (the forward's temporaries, the backward's) is planned
    // (scratch_plan: the kept ones placed) in the host buffer the other programs share, for each half as it runs.
    std::vector<std::pair<Tensor *, size_t>> kept;
    size_t kept_bytes = 0;
    AllocPlan scratch_plan;
    Tensor * y = nullptr;
    TokenPositions pos{nullptr};
    std::vector<int32_t> pos_values, first_values;  // what pos points at while the layer is kept
    size_t din_bytes = 0;
    KeptLayer(const Trainer & tr, int layer, const MicroBatchInfo & mb) : p(tr, layer, tr.host_memory(layer), true, mb) {}
};

CpuBackend & Trainer::kept_backend(int layer) const {
    if (kept_graphs_.size() < static_cast<size_t>(num_seq_layers())) kept_graphs_.resize(static_cast<size_t>(num_seq_layers()));
    std::unique_ptr<CpuBackend> & b = kept_graphs_[static_cast<size_t>(layer)];
    if (!b) b = std::make_unique<CpuBackend>();
    return *b;
}

std::unique_ptr<Trainer::KeptLayer> Trainer::keep_layer(int layer, const void * in, const void * dout, void * din,
                                                        const MicroBatchInfo & mb) const {
    const ProgramKey key = program_key(ProgramKind::Backward, layer, mb, true);
    std::unique_ptr<KeptLayer> k;
    if (replays()) {
        const auto it = kept_cache_.find(key);
        if (it != kept_cache_.end()) {
            k = std::move(it->second);
            kept_cache_.erase(it);
        }
    }
    if (!k) {
        const HParams hp = backward_hparams(mb);
        const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
        k = std::make_unique<KeptLayer>(*this, layer, mb);
        Program & p = k->p;
        Program::Step & s = p.new_step();  // (its positions and zeros are handled here, not by run_program)
        // x's gradient (din) is zeroed right before the backward half runs (the buffer serves other layers before)
        Tensor * x = p.hidden_param(s, Arg::In, 0, Arg::Din, 0, E, T, B, /*zero=*/false);
        k->din_bytes = hidden_bytes(mb);
        k->pos = p.positions(s, mb);
        // (y is not flagged as an output: it is the last forward node and is copied out before any backward
        // node runs.)
        k->y = build_layer(p.ctx, hp, p.b.layer, layer - 1, x, k->pos, &p.b.lora, nullptr, cfg_.attention_type);
        build_forward(k->whole, k->y);
        const size_t n_forward = k->whole.nodes.size();
        std::vector<Tensor *> ps = p.b.params;
        ps.push_back(x);
        build_backward(p.ctx, k->whole, k->y, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), ps);
        k->forward.leafs = k->backward.leafs = k->whole.leafs;
        k->forward.nodes.assign(k->whole.nodes.begin(), k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward));
        k->backward.nodes.assign(k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward), k->whole.nodes.end());
        split_kept_memory(*k);
    }
    CallArgs a;
    a.in = in;
    a.dout = dout;
    a.din = din;
    rebind(k->p, host_memory(layer), a);
    position_values(mb, k->pos_values, k->first_values);
    k->pos.pos->data = k->pos_values.data();
    if (k->pos.key_start) k->pos.key_start->data = k->first_values.data();
    return k;
}

void Trainer::split_kept_memory(KeptLayer & k) {
    // The forward nodes (their roots: views have no memory) that a backward node reads, or is a view of.
    const std::unordered_set<const Tensor *> forward(k.forward.nodes.begin(), k.forward.nodes.end());
    std::unordered_set<const Tensor *> read;
    auto root = [](const Tensor * t) { return t->view_src ? t->view_src : t; };
    for (const Tensor * n : k.backward.nodes) {
        if (n->view_src && forward.count(n->view_src)) read.insert(n->view_src);
        for (const Tensor * src : n->src)
            if (src && forward.count(root(src))) read.insert(root(src));
    }
    constexpr size_t kAlign = 64;
    k.kept.clear();
    k.kept_bytes = 0;
    std::unordered_set<const Tensor *> placed;
    for (Tensor * n : k.whole.nodes)
        if (!n->is_view() && read.count(n)) {
            k.kept.push_back({n, k.kept_bytes});
            k.kept_bytes += std::max(kAlign, (n->nbytes() + n->aux_bytes + kAlign - 1) / kAlign * kAlign);
            placed.insert(n);
        }
    k.scratch_plan = plan_graph(k.whole, kAlign, &placed);
}

void Trainer::bind_kept(int layer, KeptLayer & k) const {
    char * base = static_cast<char *>(kept_backend(layer).reserve(k.kept_bytes));
    for (const auto & [t, offset] : k.kept) t->data = base + offset;
    host_graphs_.allocate(k.whole, k.scratch_plan);
}

Trainer::KeptBytes Trainer::kept_layer_bytes(int layer, const MicroBatchInfo & mb) const {
    const std::unique_ptr<KeptLayer> k = keep_layer(layer, nullptr, nullptr, nullptr, mb);
    return {k->kept_bytes, k->scratch_plan.size};
}

void Trainer::release_kept(int layer, const MicroBatchInfo & mb, std::unique_ptr<KeptLayer> k) const {
    if (!replays()) return;
    if (kept_cache_.size() >= kMaxCachedPrograms) kept_cache_.clear();  // shapes that keep changing: bound it
    kept_cache_.emplace(program_key(ProgramKind::Backward, layer, mb, true), std::move(k));
}

Trainer::~Trainer() = default;

size_t kept_activation_layers(const std::vector<size_t> & layer_graph_bytes, size_t budget, size_t * kept_bytes) {
    size_t sum = 0, n = 0;
    for (const size_t b : layer_graph_bytes) {
        if (sum + b > budget) break;
        sum += b;
        ++n;
    }
    if (kept_bytes) *kept_bytes = sum;
    return n;
}

double Trainer::accumulate(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale,
                           int n_threads, int64_t step, int64_t seq_offset, const int32_t * positions) {
    MicroBatchInfo mb;
    mb.packed = positions != nullptr;
    mb.positions = positions;
    mb.seq_len = T;
    mb.n_seq = B;
    mb.loss_scale = loss_scale;
    mb.step = step;
    mb.seq_offset = seq_offset;
    mb.token_chunk = cfg_.token_chunk;
    ProgramContext pc;
    pc.n_threads = n_threads;
    const int L = num_seq_layers();
    const size_t H = hidden_bytes(mb) / sizeof(float);

    // Forward: the input of every layer (the checkpoints) is kept, and the first decoder layers' whole graphs
    // while they fit cfg_.activation_memory (never with token chunks); the head runs forward + backward at once.
    std::vector<std::vector<float>> act(static_cast<size_t>(L));
    // The output gradients of the backward sweep alternate between two buffers: layer l reads its output's
    // gradient from grad_buf[(L - 2 - l) % 2] and writes its input's into the other.
    std::vector<float> grad_buf[2] = {std::vector<float>(H), std::vector<float>(H)};
    auto dout_of = [&](int l) { return grad_buf[(L - 2 - l) % 2].data(); };
    auto din_of = [&](int l) { return grad_buf[(L - 1 - l) % 2].data(); };
    std::vector<std::unique_ptr<KeptLayer>> kept(static_cast<size_t>(L));
    size_t kept_bytes = 0;
    kept_live_.store(0);
    bool keeping = cfg_.activation_memory > 0 && cfg_.token_chunk == 0;
    for (int l = 0; l < L - 1; ++l) {
        act[static_cast<size_t>(l + 1)].resize(H);
        const void * in = l == 0 ? static_cast<const void *>(ids) : act[static_cast<size_t>(l)].data();
        if (keeping && l > 0) {
            std::unique_ptr<KeptLayer> k = keep_layer(l, in, dout_of(l), din_of(l), mb);
            const size_t bytes = k->kept_bytes;
            if (kept_bytes + bytes <= cfg_.activation_memory) {
                kept_bytes += bytes;
                bind_kept(l, *k);
                host_graphs_.compute(k->forward, pc.n_threads);
                CpuGraphRunner(nullptr, &host_graphs_).copy_f32(act[static_cast<size_t>(l + 1)].data(), k->y);
                kept[static_cast<size_t>(l)] = std::move(k);
                kept_live_.store(kept_bytes);
                note_graph_bytes(kept[static_cast<size_t>(l)]->scratch_plan.size);
                continue;
            }
            release_kept(l, mb, std::move(k));
            keeping = false;  // this layer and the later ones recompute (the order plan_run assumes)
        }
        seq_forward(l, host_memory(l), in, act[static_cast<size_t>(l + 1)].data(), mb, pc);
    }
    float loss = 0.0f;
    seq_head(host_memory(L - 1), act[static_cast<size_t>(L - 1)].data(), labels, &loss, dout_of(L - 2), mb, pc);
    // Backward, last layer to first: the kept ones run their backward half, the others are recomputed from
    // their checkpoint.
    for (int l = L - 2; l >= 0; --l) {
        if (std::unique_ptr<KeptLayer> & k = kept[static_cast<size_t>(l)]) {
            std::memset(din_of(l), 0, k->din_bytes);
            bind_kept(l, *k);  // (the shared buffer may have moved since the forward half)
            host_graphs_.compute(k->backward, pc.n_threads);
            note_graph_bytes(k->scratch_plan.size);
            kept_live_.fetch_sub(k->kept_bytes);
            release_kept(l, mb, std::move(k));
            continue;
        }
        seq_backward(l, host_memory(l), l == 0 ? static_cast<const void *>(ids) : act[static_cast<size_t>(l)].data(), dout_of(l),
                     l == 0 ? nullptr : din_of(l), mb, pc);
    }
    return loss;
}

double Trainer::loss(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale, int n_threads,
                     const int32_t * positions) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, labels, T, B, positions);
    Tensor * x = build_embedding(ctx, w_.tok_embd, in.ids, &lora_);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        x = build_layer(ctx, hp, w_.layers[il], static_cast<int>(il), x, {in.pos, in.key_start}, &lora_);
    Tensor * l = build_loss(ctx, w_, cont_if_needed(ctx, x), in.labels, loss_scale);
    l->flags |= kFlagOutput;
    Graph g;
    build_forward(g, l);
    CpuBackend be;
    be.allocate(g);
    be.compute(g, n_threads);
    return tensor_get_f32(l)[0];
}

std::vector<float> Trainer::logits(const int32_t * ids, int64_t T, int n_threads, const int32_t * positions) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, nullptr, T, 1, positions);
    Tensor * x = build_embedding(ctx, w_.tok_embd, in.ids, &lora_);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        x = build_layer(ctx, hp, w_.layers[il], static_cast<int>(il), x, {in.pos, in.key_start}, &lora_);
    Tensor * y = build_head_logits(ctx, hp, w_, x, &lora_);
    y->flags |= kFlagOutput;
    Graph g;
    build_forward(g, y);
    CpuBackend be;
    be.allocate(g);
    be.compute(g, n_threads);
    return tensor_get_f32(y);
}

void Trainer::save(const std::string & path) const {
    if (adapter_) {
        adapter_->save(path);
        return;
    }
    // Full: every KV of the base, every tensor in file order; trained ones converted back to their dtype.
    const gguf::Reader & f = model_.file();
    gguf::Writer w(f.alignment());
    for (const gguf::KV & kv : f.kvs())
        if (kv.key != "general.alignment") w.set_kv(kv);
    Context tmp;
    for (const gguf::TensorInfo & ti : f.tensors()) {
        const Param * p = nullptr;
        for (const Param & q : params_)
            if (q.name == ti.name) p = &q;
        const Tensor * src = model_.find(ti.name);
        if (p && ti.type == gguf::TensorType::F32) {  // the master is the tensor as stored: no copy
            w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, p->t->data);
        } else if (p) {
            Tensor * out = tmp.new_tensor(ti.type, ti.ne);
            tmp.alloc_data(out);
            tensor_set_f32(out, tensor_get_f32(p->t));
            w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, out->data);
        } else {
            w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, src->data);
        }
    }
    w.write(path);
}

} // namespace rp
