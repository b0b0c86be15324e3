#include "models/finetune.h"

#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <cstring>
#include <functional>
#include <random>
#include <type_traits>
#include <unordered_map>
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
};

Trainer::Bound Trainer::bind(Context & ctx, int layer, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb) const {
    const std::vector<SeqTensor> & list = seq_tensors(layer);
    if (mem.data.size() != list.size() || (with_grads && mem.grad.size() != list.size()))
        throw Error("layer " + seq_layer_name(layer) + ": memory for " + std::to_string(mem.data.size()) + " tensors, the layer has " +
                    std::to_string(list.size()));
    std::unordered_map<const Tensor *, Tensor *> map;
    Bound b;
    for (size_t i = 0; i < list.size(); ++i) {
        const Tensor * src = list[i].t;
        Tensor * d = ctx.new_tensor(src->type, src->ne);
        d->name = src->name;
        d->data = mem.data[i];
        if (with_grads && list[i].param >= 0) {
            set_param(ctx, d);
            d->grad->data = mem.grad[i];
            b.params.push_back(d);
        }
        map[src] = d;
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

// A program's graph context, where its graphs run (the device's runner from pc, or a CPU runner over host
// memory) and its layer's tensors bound to `mem`.
struct Trainer::Program {
    Context ctx;
    CpuGraphRunner host;
    GraphRunner & runner;
    Bound b;
    Program(const Trainer & tr, const ProgramContext & pc, int layer, const LayerMemory & mem, bool grads, const MicroBatchInfo & mb)
        : host(nullptr, &tr.host_graphs_), runner(pc.runner ? *pc.runner : host), b(tr.bind(ctx, layer, mem, grads, mb)) {}
};

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

void Trainer::run_graph(Graph & g, GraphRunner & runner, int n_threads, const std::function<void()> & read_back) const {
    note_graph_bytes(runner.run(g, n_threads, read_back));
}

void Trainer::note_graph_bytes(size_t graph) const {
    const size_t bytes = graph + kept_live_.load();
    size_t prev = peak_graph_bytes_.load();
    while (bytes > prev && !peak_graph_bytes_.compare_exchange_weak(prev, bytes)) {}
}

namespace {

// A leaf over caller memory.
Tensor * leaf(Context & ctx, DType type, const void * data, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
    Tensor * t = ctx.new_tensor(type, ne0, ne1, ne2);
    t->data = const_cast<void *>(data);
    t->flags |= kFlagInput;
    return t;
}

// The micro-batch's token positions, uploaded into the device's memory by its runner (regenerated by every
// program, never shipped with the activations). Unpacked: 0 .. T-1, shared by the sequences. Packed: the
// micro-batch's own positions and each token's first visible key (the start of its example).
TokenPositions positions(Context & ctx, const MicroBatchInfo & mb, GraphRunner & runner) {
    const int64_t T = mb.seq_len;
    if (!mb.packed) {
        std::vector<int32_t> host(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) host[static_cast<size_t>(t)] = static_cast<int32_t>(t);
        return leaf(ctx, DType::I32, runner.upload(host.data(), host.size() * sizeof(int32_t)), T);
    }
    const size_t n = static_cast<size_t>(mb.tokens());
    std::vector<int32_t> pos(n, 0), first(n, 0);  // a runner that only measures needs the shapes alone
    if (mb.positions) {
        pos.assign(mb.positions, mb.positions + n);
        packed_key_starts(pos.data(), T, mb.n_seq, first.data());
    }
    Tensor * p = leaf(ctx, DType::I32, runner.upload(pos.data(), n * sizeof(int32_t)), T * mb.n_seq);
    Tensor * ks = leaf(ctx, DType::I32, runner.upload(first.data(), n * sizeof(int32_t)), T * mb.n_seq);
    return {p, ks};
}

// A hidden-state leaf that is a parameter of the graph: its gradient goes to `grad` (zeroed first, in order
// with the graph on the device).
Tensor * hidden_param(Context & ctx, const void * data, void * grad, size_t bytes, int64_t n_embd, int64_t T, int64_t B,
                      GraphRunner & runner) {
    Tensor * x = leaf(ctx, DType::F32, data, n_embd, T, B);
    set_param(ctx, x);
    runner.zero(grad, bytes);
    x->grad->data = grad;
    return x;
}

} // namespace

namespace {

// The token ranges of a chunked program: [t0, t1) over the micro-batch's tokens flattened (sequence-major, as
// [n_embd, T, B] lies in memory); one range of every token when chunk is 0 or not smaller.
// A runner that only measures gets the ranges whose graphs differ: the first two (a head's first range
// writes the loss, the others add to it) and the last (it may be shorter).
std::vector<std::pair<int64_t, int64_t>> token_ranges(const MicroBatchInfo & mb, const GraphRunner & runner) {
    const int64_t n = mb.tokens(), c = mb.token_chunk > 0 && mb.token_chunk < n ? mb.token_chunk : n;
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int64_t t0 = 0; t0 < n; t0 += c) {
        if (!runner.computes() && r.size() >= 2 && t0 + c < n) continue;
        r.push_back({t0, std::min(n, t0 + c)});
    }
    return r;
}

template <typename T> T * at_token(T * base, int64_t token, int64_t n_embd) {
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T *>(reinterpret_cast<Byte *>(base) + static_cast<size_t>(token * n_embd) * sizeof(float));
}

} // namespace

// Token-chunked programs: the attention half of decoder layer `layer` (its output, residual included) over
// every token, copied into dst.
void Trainer::attention_half_into(Program & p, int layer, const void * in, void * dst, const MicroBatchInfo & mb,
                                  int n_threads) const {
    const HParams & hp = model_.hparams();
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    Tensor * h = attention_block(p.ctx, hp, p.b.layer, layer - 1, leaf(p.ctx, DType::F32, in, E, T, B), positions(p.ctx, mb, p.runner),
                                 &p.b.lora, nullptr, cfg_.attention_type);
    h->flags |= kFlagOutput;
    Graph g;
    build_forward(g, h);
    run_graph(g, p.runner, n_threads, [&] { p.runner.copy_f32(dst, h); });
}

void Trainer::seq_forward(int layer, const LayerMemory & mem, const void * in, void * out, const MicroBatchInfo & mb,
                          ProgramContext & pc) const {
    const HParams & hp = model_.hparams();
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    Program p(*this, pc, layer, mem, false, mb);
    Context & ctx = p.ctx;
    GraphRunner & runner = p.runner;
    const Bound & b = p.b;
    const auto ranges = token_ranges(mb, runner);
    if (layer == 0 || ranges.size() == 1) {
        Tensor * y = nullptr;
        if (layer == 0) {
            y = build_embedding(ctx, b.w.tok_embd, leaf(ctx, DType::I32, in, T, B), &b.lora);
        } else {
            Tensor * x = leaf(ctx, DType::F32, in, E, T, B);
            y = build_layer(ctx, hp, b.layer, layer - 1, x, positions(ctx, mb, runner), &b.lora, nullptr, cfg_.attention_type);
        }
        y->flags |= kFlagOutput;
        Graph g;
        build_forward(g, y);
        run_graph(g, runner, pc.n_threads, [&] { runner.copy_f32(out, y); });
        return;
    }
    // Token-chunked: the attention half over every token into `out`, then the feed-forward half range by range
    // in place (each graph reads its range of `out` and its result is copied back over it after it ran).
    attention_half_into(p, layer, in, out, mb, pc.n_threads);
    for (const auto & [t0, t1] : ranges) {
        p.b.lora.dropout.token_offset = t0;
        void * h = at_token(out, t0, E);
        Tensor * y = ffn_block(ctx, hp, b.layer, layer - 1, leaf(ctx, DType::F32, h, E, t1 - t0), &b.lora);
        y->flags |= kFlagOutput;
        Graph g;
        build_forward(g, y);
        run_graph(g, runner, pc.n_threads, [&] { runner.copy_f32(h, y); });
    }
}

void Trainer::seq_head(const LayerMemory & mem, const void * in, const int32_t * labels, float * loss, void * din,
                       const MicroBatchInfo & mb, ProgramContext & pc) const {
    const HParams & hp = model_.hparams();
    const int64_t E = hp.n_embd;
    Program p(*this, pc, num_seq_layers() - 1, mem, true, mb);
    Context & ctx = p.ctx;
    GraphRunner & runner = p.runner;
    const Bound & b = p.b;
    // One graph per token range (one range unless chunked): forward, loss and backward of its tokens, the
    // parameter gradients accumulating across ranges, the loss summed range by range into *loss.
    const auto ranges = token_ranges(mb, runner);
    for (const auto & [t0, t1] : ranges) {
        const int64_t n = t1 - t0;
        const bool whole = ranges.size() == 1;
        Tensor * x = whole ? hidden_param(ctx, in, din, hidden_bytes(mb), E, mb.seq_len, mb.n_seq, runner)
                           : hidden_param(ctx, at_token(in, t0, E), at_token(din, t0, E), static_cast<size_t>(n * E) * sizeof(float), E, n, 1, runner);
        Tensor * l = build_loss(ctx, b.w, x, leaf(ctx, DType::I32, labels + t0, n), mb.loss_scale);
        Graph g;
        build_forward(g, l);
        std::vector<Tensor *> ps = b.params;
        ps.push_back(x);
        build_backward(ctx, g, l, ps);
        Tensor * total = t0 == 0 ? l : add(ctx, leaf(ctx, DType::F32, loss, 1), l);
        total->flags |= kFlagOutput;
        build_forward(g, total);
        run_graph(g, runner, pc.n_threads, [&] { runner.copy_f32(loss, total); });
    }
}

HParams Trainer::backward_hparams(const MicroBatchInfo & mb) const {
    HParams hp = model_.hparams();
    hp.moe_aux = cfg_.moe_aux_loss * static_cast<float>(hp.n_expert) * mb.loss_scale;
    return hp;
}

void Trainer::seq_backward(int layer, const LayerMemory & mem, const void * in, const void * dout, void * din,
                           const MicroBatchInfo & mb, ProgramContext & pc) const {
    const HParams hp = backward_hparams(mb);
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    Program p(*this, pc, layer, mem, true, mb);
    Context & ctx = p.ctx;
    GraphRunner & runner = p.runner;
    const Bound & b = p.b;
    const auto ranges = token_ranges(mb, runner);
    if (layer == 0) {
        if (b.params.empty()) return;  // nothing trainable in the embedding, and ids have no gradient
        Graph g;
        Tensor * e = build_embedding(ctx, b.w.tok_embd, leaf(ctx, DType::I32, in, T, B), &b.lora);
        build_forward(g, e);
        build_backward(ctx, g, e, leaf(ctx, DType::F32, dout, E, T, B), b.params);
        run_graph(g, runner, pc.n_threads);
        return;
    }
    auto attention_backward = [&](Tensor * (*whole_layer)(Context &, const HParams &, const LayerWeights &, int, Tensor *, const TokenPositions &,
                                                          const LoraSet *, const LayerKv *, DType)) {
        Graph g;
        Tensor * x = hidden_param(ctx, in, din, hidden_bytes(mb), E, T, B, runner);
        Tensor * y = whole_layer(ctx, hp, b.layer, layer - 1, x, positions(ctx, mb, runner), &b.lora, nullptr, cfg_.attention_type);
        build_forward(g, y);
        std::vector<Tensor *> ps = b.params;
        ps.push_back(x);
        build_backward(ctx, g, y, leaf(ctx, DType::F32, dout, E, T, B), ps);
        run_graph(g, runner, pc.n_threads);
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
    attention_half_into(p, layer, in, din, mb, pc.n_threads);
    void * dh = const_cast<void *>(dout);
    for (const auto & [t0, t1] : ranges) {
        p.b.lora.dropout.token_offset = t0;
        Tensor * h = leaf(ctx, DType::F32, at_token(din, t0, E), E, t1 - t0);
        set_param(ctx, h);
        h->grad->data = at_token(dh, t0, E);  // not zeroed: it holds the residual's share
        Tensor * f = ffn_block(ctx, hp, b.layer, layer - 1, h, &b.lora, /*residual=*/false);
        Graph g;
        build_forward(g, f);
        std::vector<Tensor *> ps = b.params;
        ps.push_back(h);
        build_backward(ctx, g, f, leaf(ctx, DType::F32, at_token(dh, t0, E), E, t1 - t0), ps);
        run_graph(g, runner, pc.n_threads);
    }
    p.b.lora.dropout.token_offset = 0;
    attention_backward(attention_block);
}

// A decoder layer's forward + backward graph kept between the sweeps of one micro-batch: the graph seq_backward
// would rebuild from the layer's input, planned once into its own buffer. Its forward nodes run in the forward
// sweep (the layer output is copied out as the next layer's input), the others in the backward sweep, so the
// kept activations replace the recompute and the gradients are the recompute path's bits.
struct Trainer::KeptLayer {
    Program p;
    Graph whole, forward, backward;
    CpuBackend & be;  // the layer's buffer, kept by the trainer across micro-batches and steps
    Tensor * y = nullptr;
    void * din = nullptr;
    size_t din_bytes = 0;
    KeptLayer(const Trainer & tr, const ProgramContext & pc, int layer, const MicroBatchInfo & mb)
        : p(tr, pc, layer, tr.host_memory(layer), true, mb), be(tr.kept_backend(layer)) {}
};

CpuBackend & Trainer::kept_backend(int layer) const {
    if (kept_graphs_.size() < static_cast<size_t>(num_seq_layers())) kept_graphs_.resize(static_cast<size_t>(num_seq_layers()));
    std::unique_ptr<CpuBackend> & b = kept_graphs_[static_cast<size_t>(layer)];
    if (!b) b = std::make_unique<CpuBackend>();
    return *b;
}

std::unique_ptr<Trainer::KeptLayer> Trainer::keep_layer(int layer, const void * in, const void * dout, void * din,
                                                        const MicroBatchInfo & mb, ProgramContext & pc) const {
    const HParams hp = backward_hparams(mb);
    const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
    auto k = std::make_unique<KeptLayer>(*this, pc, layer, mb);
    Context & ctx = k->p.ctx;
    const Bound & b = k->p.b;
    Tensor * x = leaf(ctx, DType::F32, in, E, T, B);
    set_param(ctx, x);
    x->grad->data = din;  // zeroed right before the backward half runs (the buffer serves other layers before)
    k->din = din;
    k->din_bytes = hidden_bytes(mb);
    // (y is not flagged as an output: it is the last forward node and is copied out before any backward node
    // runs, so the graph and its plan are exactly seq_backward's, which plan_run measures.)
    k->y = build_layer(ctx, hp, b.layer, layer - 1, x, positions(ctx, mb, k->p.runner), &b.lora, nullptr, cfg_.attention_type);
    build_forward(k->whole, k->y);
    const size_t n_forward = k->whole.nodes.size();
    std::vector<Tensor *> ps = b.params;
    ps.push_back(x);
    build_backward(ctx, k->whole, k->y, leaf(ctx, DType::F32, dout, E, T, B), ps);
    k->forward.leafs = k->backward.leafs = k->whole.leafs;
    k->forward.nodes.assign(k->whole.nodes.begin(), k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward));
    k->backward.nodes.assign(k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward), k->whole.nodes.end());
    return k;
}

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
            std::unique_ptr<KeptLayer> k = keep_layer(l, in, dout_of(l), din_of(l), mb, pc);
            const size_t bytes = k->be.plan(k->whole);
            if (kept_bytes + bytes <= cfg_.activation_memory) {
                kept_bytes += bytes;
                k->be.allocate(k->whole);
                k->be.compute(k->forward, pc.n_threads);
                k->p.runner.copy_f32(act[static_cast<size_t>(l + 1)].data(), k->y);
                kept[static_cast<size_t>(l)] = std::move(k);
                kept_live_.store(kept_bytes);
                note_graph_bytes(0);
                continue;
            }
            keeping = false;  // this layer and the later ones recompute (the order plan_run assumes)
        }
        seq_forward(l, host_memory(l), in, act[static_cast<size_t>(l + 1)].data(), mb, pc);
    }
    float loss = 0.0f;
    seq_head(host_memory(L - 1), act[static_cast<size_t>(L - 1)].data(), labels, &loss, dout_of(L - 2), mb, pc);
    // Backward, last layer to first: the kept ones run their backward half, the others are recomputed from
    // their checkpoint.
    for (int l = L - 2; l >= 0; --l) {
        if (KeptLayer * k = kept[static_cast<size_t>(l)].get()) {
            std::memset(k->din, 0, k->din_bytes);
            k->be.compute(k->backward, pc.n_threads);
            kept_live_.fetch_sub(k->be.plan().size);
            kept[static_cast<size_t>(l)].reset();
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
