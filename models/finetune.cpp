#include "models/finetune.h"

#include "ggml_rp/core/ggml_rp.h"

#include <cmath>
#include <cstring>
#include <random>

namespace rp {

std::vector<std::string> default_lora_targets() {
    return {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
}

std::vector<std::string> expand_lora_targets(const Model & model, const std::vector<std::string> & targets) {
    std::vector<std::string> out;
    for (const std::string & t : targets) {
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
            throw Error("--lora-targets: unknown target '" + t + "' (no tensor of " + model.path() +
                        " is named like blk.N." + t + ".weight or " + t + ".weight)");
    }
    return out;
}

namespace {

// U[0, 1) from the top 53 bits: the same on every standard library (std::uniform_real_distribution is not).
double unit(std::mt19937_64 & rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// A fresh f32 copy of a weight (the fp32 master of a full finetune).
Tensor * f32_master(Context & ctx, const Tensor * w) {
    Tensor * m = ctx.new_tensor(DType::F32, w->ne);
    m->name = w->name;
    ctx.alloc_data(m);
    const std::vector<float> v = tensor_get_f32(w);
    std::memcpy(m->data, v.data(), v.size() * sizeof(float));
    return m;
}

} // namespace

Trainer::Trainer(const Model & model, const FinetuneConfig & cfg) : model_(model), cfg_(cfg) {
    const HParams & hp = model.hparams();
    w_.tok_embd = model.tok_embd;
    w_.output_norm = model.output_norm;
    w_.output = model.output;
    w_.layers = model.layers;
    layer_params_.resize(hp.n_layer);

    auto add_param = [&](Tensor * t, std::vector<Tensor *> & group) {
        set_param(ctx_, t);
        ctx_.alloc_data(t->grad);
        params_.push_back({t->name, t});
        group.push_back(t);
    };

    if (cfg.full) {
        // Every float tensor becomes an fp32 master (quantized ones stay frozen in their dtype).
        auto master = [&](Tensor *& slot, std::vector<Tensor *> & group) {
            if (!slot || !dtype_is_float(slot->type)) return;
            slot = f32_master(ctx_, slot);
            add_param(slot, group);
        };
        master(w_.tok_embd, embd_params_);
        if (model.tied_output()) {
            w_.output = w_.tok_embd;  // one parameter, two contributions
            if (w_.tok_embd->has_flag(kFlagParam)) head_params_.push_back(w_.tok_embd);
        } else {
            master(w_.output, head_params_);
        }
        master(w_.output_norm, head_params_);
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            LayerWeights & l = w_.layers[il];
            for (Tensor ** s : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.wo,
                                &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down})
                master(*s, layer_params_[il]);
        }
        return;
    }

    if (cfg.lora_rank < 1)
        throw Error("--lora-rank must be >= 1, got " + std::to_string(cfg.lora_rank));
    const std::vector<std::string> names = expand_lora_targets(model, cfg.lora_targets);
    for (const std::string & n : names)
        if (n == "output.weight")
            throw Error("--lora-targets: 'output' (the LM head) cannot carry LoRA on the fused LM-head cross-entropy "
                        "path; use --full to train it");
    adapter_ = LoraAdapter::create(model, names, cfg.lora_rank, cfg.lora_alpha);
    lora_.add(*adapter_);

    // PEFT init: A ~ Kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0. For token_embd PEFT's
    // embedding layer does the opposite (A = 0, B ~ N(0, 1)); with llama.cpp's role swap that is our A = 0 and
    // B normal. One seeded stream in adapter order.
    std::mt19937_64 rng(cfg.seed);
    for (const LoraTensor & t : adapter_->tensors()) {
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

        std::vector<Tensor *> * group = &embd_params_;
        if (!t.embedding) {
            const int il = std::stoi(t.base.substr(4));  // "blk.N...."
            group = &layer_params_[static_cast<size_t>(il)];
        }
        add_param(t.a, *group);
        add_param(t.b, *group);
    }
}

void Trainer::zero_grads() {
    for (const Param & p : params_) std::memset(p.t->grad->data, 0, p.t->grad->nbytes());
}

Tensor * Trainer::build_embd(Context & ctx, Tensor * ids) const {
    Tensor * e = get_rows(ctx, w_.tok_embd, ids);
    if (const std::vector<LoraDelta> * ds = lora_.find(model_.tok_embd))
        for (const LoraDelta & d : *ds) {  // roles swapped (formats.md §5.3)
            Tensor * low = mul_mat(ctx, d.b, get_rows(ctx, d.a, ids));
            e = add(ctx, e, d.scale == 1.0f ? low : scale(ctx, low, d.scale));
        }
    return set_name(e, "embd");
}

Tensor * Trainer::build_head(Context & ctx, Tensor * x, Tensor * labels, float loss_scale) const {
    Tensor * h = rms_norm(ctx, x, w_.output_norm, model_.hparams().rms_eps);
    h = reshape(ctx, h, h->ne[0], h->ne[1] * h->ne[2] * h->ne[3]);
    return set_name(lm_head_ce(ctx, h, w_.output, labels, loss_scale, cfg_.ce_chunk), "loss");
}

namespace {

struct Inputs {
    Tensor * ids;
    Tensor * labels;
    Tensor * pos;
};

Inputs make_inputs(Context & ctx, const int32_t * ids, const int32_t * labels, int64_t T, int64_t B) {
    Inputs in{};
    in.ids = ctx.new_tensor(DType::I32, T, B);
    ctx.alloc_data(in.ids);
    std::memcpy(in.ids->data, ids, static_cast<size_t>(T * B) * sizeof(int32_t));
    if (labels) {
        in.labels = ctx.new_tensor(DType::I32, T * B);
        ctx.alloc_data(in.labels);
        std::memcpy(in.labels->data, labels, static_cast<size_t>(T * B) * sizeof(int32_t));
    }
    in.pos = ctx.new_tensor(DType::I32, T);
    ctx.alloc_data(in.pos);
    for (int64_t t = 0; t < T; ++t) in.pos->data_as<int32_t>()[t] = static_cast<int32_t>(t);
    for (Tensor * t : {in.ids, in.labels, in.pos})
        if (t) t->flags |= kFlagInput;
    return in;
}

// Runs a graph whose output node `out` is copied into the leaf `dst` (same shape, contiguous f32).
void run_into(CpuBackend & be, Graph & g, Tensor * out, Tensor * dst, int n_threads, size_t & peak) {
    peak = std::max(peak, be.allocate(g));
    be.compute(g, n_threads);
    if (dst) {
        const std::vector<float> v = tensor_get_f32(out);
        std::memcpy(dst->data, v.data(), v.size() * sizeof(float));
    }
}

} // namespace

double Trainer::accumulate(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale,
                           int n_threads) {
    const HParams & hp = model_.hparams();
    const int64_t L = hp.n_layer;
    Context ctx;  // this micro-batch's graphs, checkpoints and activation gradients
    const Inputs in = make_inputs(ctx, ids, labels, T, B);
    CpuBackend be;

    // Checkpoints: the input of every layer, and of the tail (cp[L]). Each gets a gradient buffer.
    std::vector<Tensor *> cp(static_cast<size_t>(L + 1));
    for (Tensor *& c : cp) {
        c = ctx.new_tensor(DType::F32, hp.n_embd, T, B);
        ctx.alloc_data(c);
        set_param(ctx, c);
        ctx.alloc_data(c->grad);
        c->flags |= kFlagInput;
    }

    // Forward: embedding, then one graph per layer (only the layer inputs are kept).
    {
        Tensor * e = build_embd(ctx, in.ids);
        e->flags |= kFlagOutput;
        Graph g;
        build_forward(g, e);
        run_into(be, g, e, cp[0], n_threads, peak_graph_bytes_);
    }
    for (int64_t il = 0; il < L; ++il) {
        Tensor * y = build_layer(ctx, hp, w_.layers[static_cast<size_t>(il)], static_cast<int>(il), cp[il], in.pos, &lora_);
        y->flags |= kFlagOutput;
        Graph g;
        build_forward(g, y);
        run_into(be, g, y, cp[il + 1], n_threads, peak_graph_bytes_);
    }

    // Tail: final norm + LM head + CE and its backward in one graph.
    double loss_value = 0.0;
    {
        Tensor * loss = build_head(ctx, cp[L], in.labels, loss_scale);
        Graph g;
        build_forward(g, loss);
        std::vector<Tensor *> ps = head_params_;
        ps.push_back(cp[L]);
        build_backward(ctx, g, loss, ps);
        run_into(be, g, loss, nullptr, n_threads, peak_graph_bytes_);
        loss_value = tensor_get_f32(loss)[0];
    }

    // Backward per layer, last to first, recomputing each layer from its checkpoint.
    for (int64_t il = L - 1; il >= 0; --il) {
        Tensor * y = build_layer(ctx, hp, w_.layers[static_cast<size_t>(il)], static_cast<int>(il), cp[il], in.pos, &lora_);
        Graph g;
        build_forward(g, y);
        std::vector<Tensor *> ps = layer_params_[static_cast<size_t>(il)];
        ps.push_back(cp[il]);
        build_backward(ctx, g, y, cp[il + 1]->grad, ps);
        run_into(be, g, y, nullptr, n_threads, peak_graph_bytes_);
    }

    // Embedding backward (token_embd or its LoRA pair).
    if (!embd_params_.empty()) {
        Tensor * e = build_embd(ctx, in.ids);
        Graph g;
        build_forward(g, e);
        build_backward(ctx, g, e, cp[0]->grad, embd_params_);
        run_into(be, g, e, nullptr, n_threads, peak_graph_bytes_);
    }
    return loss_value;
}

double Trainer::loss(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale, int n_threads) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, labels, T, B);
    Tensor * x = build_embd(ctx, in.ids);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        x = build_layer(ctx, hp, w_.layers[il], static_cast<int>(il), x, in.pos, &lora_);
    Tensor * l = build_head(ctx, cont_if_needed(ctx, x), in.labels, loss_scale);
    l->flags |= kFlagOutput;
    Graph g;
    build_forward(g, l);
    CpuBackend be;
    be.allocate(g);
    be.compute(g, n_threads);
    return tensor_get_f32(l)[0];
}

std::vector<float> Trainer::logits(const int32_t * ids, int64_t T, int n_threads) {
    const HParams & hp = model_.hparams();
    Context ctx;
    const Inputs in = make_inputs(ctx, ids, nullptr, T, 1);
    Tensor * x = build_embd(ctx, in.ids);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        x = build_layer(ctx, hp, w_.layers[il], static_cast<int>(il), x, in.pos, &lora_);
    Tensor * h = rms_norm(ctx, x, w_.output_norm, hp.rms_eps);
    Tensor * y = mul_mat(ctx, w_.output, h);
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
        if (p) {
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
