#include "models/train/trainer.h"

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

std::vector<std::string> default_lora_targets() {
    return {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
}

std::vector<std::string> expand_lora_targets(const Model & model, const std::vector<std::string> & requested) {
    std::vector<std::string> out, fused, targets = requested;
    // qwen35, qwen35moe: the defaults adapt every projection of both layer kinds, the Gated DeltaNet layers' too (the convolution's
    // q | k | v, the output gate z, beta's and the decay's, the output): PEFT's all-linear. A list given is taken as is.
    if (model.hparams().arch->delta_net && requested == default_lora_targets())
        for (const char * t : {"attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"}) targets.emplace_back(t);
    // And a shared expert's projections (qwen35moe), with the routed experts' the defaults name.
    if (model.hparams().arch->shared_expert && requested == default_lora_targets())
        for (const char * t : {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}) targets.emplace_back(t);
    for (std::string t : targets) {
        // On a mixture of experts the feed-forward targets name the experts' tensors (the router,
        // ffn_gate_inp, is a target of its own).
        if (model.hparams().is_moe() && (t == "ffn_gate" || t == "ffn_up" || t == "ffn_down")) t += "_exps";
        // phi3's fused projections: attn_q / attn_k / attn_v select attn_qkv, ffn_gate the fused ffn_up (llama.cpp's
        // adapters, like PEFT's on qkv_proj / gate_up_proj, adapt the fused matrix as a whole).
        const LayerWeights * l0 = model.layers.empty() ? nullptr : &model.layers[0];
        const bool fused_qkv = model.hparams().arch->fused_qkv && l0 && l0->wqkv;  // (qwen35's attn_qkv is its DeltaNet's)
        if (fused_qkv && (t == "attn_q" || t == "attn_k" || t == "attn_v")) t = "attn_qkv";
        if (l0 && l0->ffn_up && !l0->ffn_gate && !l0->ffn_gate_inp && t == "ffn_gate") t = "ffn_up";
        const bool fused_model = l0 && (fused_qkv || (l0->ffn_up && !l0->ffn_gate && !l0->ffn_gate_inp));
        if (fused_model && (t == "attn_qkv" || t == "ffn_up")) {  // several short names, one fused matrix
            if (std::find(fused.begin(), fused.end(), t) != fused.end()) continue;
            fused.push_back(t);
        }
        size_t hits = 0;
        for (const Tensor * w : model.weights()) {
            if (std::find(model.mtp.begin(), model.mtp.end(), w) != model.mtp.end()) continue;  // never run: nothing to adapt
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
    w_ = model.graph_weights(cfg.context);
    const bool alloc = data == TrainerData::Allocate;

    auto add_param = [&](Tensor * t) {
        set_param(ctx_, t);
        if (alloc) ctx_.alloc_data(t->grad);
        params_.push_back({t->name, t});
    };

    if (!(cfg.lora_dropout >= 0.0f && cfg.lora_dropout < 1.0f))
        throw Error("lora_dropout must be in [0, 1), got " + std::to_string(cfg.lora_dropout));
    if (cfg.boundary_type != DType::F32 && cfg.boundary_type != DType::BF16)
        throw Error(std::string("boundary_type ") + dtype_name(cfg.boundary_type) + ": the hidden state at layer boundaries is f32 or bf16");
    if (cfg.grpo && cfg.preference) throw Error("grpo and preference: one objective at a time");
    if (cfg.answer_slots < 1 || (cfg.answer_slots > 1 && (cfg.answer_slots % 2 != 0 || !cfg.preference)))
        throw Error("answer_slots " + std::to_string(cfg.answer_slots) + ": 1, or an even number of a preference objective's answers per packed sequence");
    if (cfg.full && !cfg.start_adapter.empty())
        throw Error(cfg.start_adapter + ": a LoRA adapter cannot start a full finetune (start_adapter with full)");
    if (cfg.full) {
        // Every float tensor becomes an fp32 master (quantized ones stay frozen in their dtype).
        for (const std::string & n : cfg.full_tensors) {
            const Tensor * t = model.find(n);
            if (!t) throw Error("full_tensors: the model has no tensor '" + n + "'");
            if (model.is_constant(t))
                throw Error("full_tensors: '" + n + "' holds the RoPE frequency factors, a constant of the model, not a weight");
        }
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
            LayerWeights & l = w_.layers[il];
            for (Tensor ** s : l.slots())
                if (!l.is_constant(*s)) master(*s);
        }
    } else {
        // cfg.start_adapter: validated against this base as llama.cpp would
        const std::unique_ptr<LoraAdapter> start = cfg.start_adapter.empty() ? nullptr : adopt_start_adapter();
        if (cfg_.lora_rank < 1)
            throw Error("lora_rank must be >= 1, got " + std::to_string(cfg_.lora_rank));
        const std::vector<std::string> names = start ? cfg_.lora_targets : expand_lora_targets(model, cfg_.lora_targets);
        for (const std::string & n : names)
            if (n == "output.weight")
                throw Error((start ? cfg.start_adapter + ": " : std::string()) +
                            "lora_targets: 'output' (the LM head) cannot carry LoRA on the fused LM-head cross-entropy "
                            "path; train it with a full finetune");
        adapter_ = LoraAdapter::create(model, names, cfg_.lora_rank, cfg_.lora_alpha, alloc);
        lora_.add(*adapter_);

        // PEFT init: A ~ Kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0. For token_embd PEFT's
        // embedding layer does the opposite (A = 0, B ~ N(0, 1)); with llama.cpp's role swap that is our A = 0 and
        // B normal. One seeded stream in adapter order.
        std::mt19937_64 rng(cfg.seed);
        for (const LoraTensor & t : adapter_->tensors()) {
            if (!alloc || start) {  // shapes only: no init; a start adapter: its factors, in f32
                if (alloc) {
                    const LoraTensor * s = start->find(t.base);
                    tensor_set_f32(t.a, tensor_get_f32(s->a));
                    tensor_set_f32(t.b, tensor_get_f32(s->b));
                }
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

    // The same, as the runtime sees it: a trainable tensor goes up as its f32 working copy (the host store's),
    // a frozen one as its own bytes.
    for (const Param & p : params_)
        param_infos_.push_back({p.name, p.t->data_as<float>(), p.t->grad ? p.t->grad->data_as<float>() : nullptr,
                                static_cast<size_t>(p.t->nelements())});
    layer_infos_.resize(seq_.size());
    for (size_t l = 0; l < seq_.size(); ++l)
        for (const SeqTensor & st : seq_[l]) {
            TensorInfo ti;
            ti.name = st.t->name;
            ti.param = st.param;
            ti.bytes = st.param >= 0 ? static_cast<size_t>(st.t->nelements()) * sizeof(float) : st.t->nbytes();
            ti.host = st.param >= 0 ? nullptr : st.t->data;
            // The frozen embedding and head matrices may stay on the host (MicroBatchInfo::vocab_on_host): layer 0
            // gathers the rows of its tokens, the head folds its rows range by range (layer_programs.cpp).
            const bool vocab = (l == 0 && st.t == w_.tok_embd) || (l + 1 == seq_.size() && st.t == w_.output);
            if (vocab && st.param < 0 && st.t->ne[2] == 1 && st.t->ne[3] == 1 && st.t->rows_contiguous()) ti.vocab_rows = st.t->ne[1];
            layer_infos_[l].push_back(ti);
        }
}

std::unique_ptr<LoraAdapter> Trainer::adopt_start_adapter() {
    const std::string & path = cfg_.start_adapter;
    std::unique_ptr<LoraAdapter> start = LoraAdapter::load(path, model_);
    if (start->tensors().empty()) throw Error(path + ": the adapter has no LoRA pairs to start from");
    const LoraTensor & first = start->tensors().front();
    std::vector<std::string> bases;
    for (const LoraTensor & t : start->tensors()) {
        if (t.rank() != first.rank())
            throw Error(path + ": '" + t.base + "' has rank " + std::to_string(t.rank()) + " and '" + first.base + "' rank " +
                        std::to_string(first.rank()) + ": an adapter to start from must have one rank");
        bases.push_back(t.base);
    }
    cfg_.lora_rank = first.rank();
    cfg_.lora_alpha = start->alpha();
    cfg_.lora_targets = std::move(bases);
    return start;
}

void Trainer::free_graph_memory() {
    host_graphs_.release();
    kept_graphs_.clear();
}

void Trainer::zero_grads() {
    // In 1 MiB pieces over the threads: one thread's memset streams at about half the machine's write
    // bandwidth.
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

std::string Trainer::layer_name(int layer) const {
    if (layer == 0) return "embedding";
    if (layer == num_layers() - 1) return "head";
    return "blk." + std::to_string(layer - 1);
}

size_t Trainer::hidden_bytes(const MicroBatchInfo & mb) const {
    return static_cast<size_t>(model_.hparams().n_embd) * static_cast<size_t>(mb.tokens()) * sizeof(float);
}

size_t Trainer::boundary_bytes(const MicroBatchInfo & mb) const {
    return static_cast<size_t>(model_.hparams().n_embd) * static_cast<size_t>(mb.tokens()) * dtype_type_size(cfg_.boundary_type);
}

Tensor * Trainer::build_loss(Context & ctx, const ModelWeights & w, Tensor * x, Tensor * labels, float loss_scale) const {
    return build_head_ce(ctx, model_.hparams(), w, x, labels, loss_scale, cfg_.ce_chunk);
}

LayerMemory Trainer::host_memory(int layer) const {
    LayerMemory mem;
    const bool head = layer == num_layers() - 1;
    for (const SeqTensor & st : seq_tensors(layer)) {
        mem.data.push_back(st.t->data);
        float * g = nullptr;
        if (st.param >= 0) g = head && head_slot_ && st.t == w_.tok_embd ? head_slot_->data_as<float>() : st.t->grad->data_as<float>();
        mem.grad.push_back(g);
    }
    return mem;
}

void Trainer::note_graph_bytes(size_t graph) {
    const size_t bytes = graph + kept_live_.load();
    size_t prev = peak_graph_bytes_.load();
    while (bytes > prev && !peak_graph_bytes_.compare_exchange_weak(prev, bytes)) {}
}

Trainer::~Trainer() = default;

namespace {

// The values of `out`, computed by the graph that ends in it on a buffer of its own.
std::vector<float> compute_on_host(Tensor * out, int n_threads) {
    out->flags |= kFlagOutput;
    Graph g;
    build_forward(g, out);
    CpuBackend be;
    be.allocate(g);
    be.compute(g, n_threads);
    return tensor_get_f32(out);
}

} // namespace

double Trainer::loss(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale, int n_threads,
                     const int32_t * positions) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, labels, T, B, positions);
    Tensor * x = build_decoder(ctx, hp, w_, in.ids, {in.pos, in.key_start}, &lora_, nullptr, cfg_.boundary_type);
    return compute_on_host(build_loss(ctx, w_, cont_if_needed(ctx, x), in.labels, loss_scale), n_threads)[0];
}

std::vector<float> Trainer::sequence_logps(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, int n_threads,
                                           const int32_t * positions) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, labels, T, B, positions);
    Tensor * x = build_decoder(ctx, hp, w_, in.ids, {in.pos, in.key_start}, &lora_, nullptr, cfg_.boundary_type);
    Tensor * nll = build_head_token_nll(ctx, hp, w_, cont_if_needed(ctx, x), in.labels, cfg_.ce_chunk);
    if (cfg_.answer_slots == 1) return compute_on_host(build_sequence_logps(ctx, nll, T, B), n_threads);
    if (!positions) throw Error("sequence_logps: answer slots (" + std::to_string(cfg_.answer_slots) + " per sequence) need packed positions");
    Tensor * slots = ctx.new_tensor(DType::I32, T * B);
    ctx.alloc_data(slots);
    slots->flags |= kFlagInput;
    answer_slot_ids(positions, T, B, cfg_.answer_slots, slots->data_as<int32_t>());
    return compute_on_host(rp::build_answer_logps(ctx, nll, slots, B, cfg_.answer_slots), n_threads);
}

std::vector<float> Trainer::token_logps(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, int n_threads,
                                        const int32_t * positions, bool reference) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, labels, T, B, positions);
    const ModelWeights base = reference ? model_.graph_weights(cfg_.context) : ModelWeights{};
    const ModelWeights & w = reference ? base : w_;
    Tensor * x = build_decoder(ctx, hp, w, in.ids, {in.pos, in.key_start}, reference ? nullptr : &lora_, nullptr, cfg_.boundary_type);
    return compute_on_host(scale(ctx, build_head_token_nll(ctx, hp, w, cont_if_needed(ctx, x), in.labels, cfg_.ce_chunk), -1.0f), n_threads);
}

std::vector<float> Trainer::logits(const int32_t * ids, int64_t T, int n_threads, const int32_t * positions) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, nullptr, T, 1, positions);
    Tensor * x = build_decoder(ctx, hp, w_, in.ids, {in.pos, in.key_start}, &lora_, nullptr, cfg_.boundary_type);
    return compute_on_host(build_head_logits(ctx, hp, w_, x, &lora_), n_threads);
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
