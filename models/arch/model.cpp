#include "models/arch/model.h"

#include "ggml_rp/core/quant.h"

#include <initializer_list>
#include <unordered_map>
#include <unordered_set>

namespace rp {

namespace {

std::string dims_str(const int64_t * ne, uint32_t n_dims) {
    std::string s = "[";
    for (uint32_t i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// What a tensor is used for decides which dtypes are acceptable.
enum class Role {
    Matrix,  // a mul_mat / get_rows weight: any dtype we can dequantize
    Vector,  // a norm weight or a bias: f32 (the element-wise ops read f32)
};

class Loader {
public:
    Loader(const gguf::Reader & f, Context & ctx, std::vector<Tensor *> & out) : f_(f), ctx_(ctx), out_(out) {}

    // The tensor `name` with exactly the shape `shape`; nullptr when absent and optional.
    Tensor * take(const std::string & name, std::initializer_list<int64_t> shape, Role role, bool required = true) {
        const gguf::TensorInfo * info = f_.find_tensor(name);
        if (!info) {
            if (required) fail("missing tensor '" + name + "'");
            return nullptr;
        }
        int64_t want[4] = {1, 1, 1, 1};
        uint32_t n = 0;
        for (int64_t v : shape) want[n++] = v;
        bool ok = true;
        for (int i = 0; i < 4; ++i) ok = ok && info->ne[i] == want[i];
        if (!ok) fail(name + ": expected " + dims_str(want, n) + ", found " + dims_str(info->ne, info->n_dims));
        if (role == Role::Vector && info->type != DType::F32)
            fail(name + ": type " + std::string(dtype_name(info->type)) + " is not supported for a norm weight or bias (f32 only)");
        if (role == Role::Matrix && !can_dequantize(info->type))
            fail(name + ": tensor type " + std::string(dtype_name(info->type)) + " is not supported");
        Tensor * t = ctx_.new_tensor(info->type, info->ne);
        t->data = const_cast<uint8_t *>(f_.tensor_data(*info));  // read-only mapping: weights are never written
        t->name = name;
        used_.insert(name);
        out_.push_back(t);
        return t;
    }

    bool has(const std::string & name) const { return f_.find_tensor(name) != nullptr; }

    // A tensor the graphs never read, in whatever type and shape the file has it.
    Tensor * take_as_is(const std::string & name) {
        const gguf::TensorInfo * info = f_.find_tensor(name);
        Tensor * t = ctx_.new_tensor(info->type, info->ne);
        t->data = const_cast<uint8_t *>(f_.tensor_data(*info));
        t->name = name;
        used_.insert(name);
        out_.push_back(t);
        return t;
    }

    // Every tensor of the file must have been taken: an unused one means a graph variant we do not implement.
    void check_all_used(const HParams & hp) const {
        for (const gguf::TensorInfo & t : f_.tensors()) {
            if (used_.count(t.name)) continue;
            if (t.name.find("attn_qkv") != std::string::npos)
                fail(t.name + ": fused attn_qkv tensors are not used by the " + std::string(hp.arch->name) +
                     " graph (separate attn_q/attn_k/attn_v expected)");
            fail(t.name + ": unexpected tensor, not used by the " + std::string(hp.arch->name) + " graph (not supported)");
        }
    }

    [[noreturn]] void fail(const std::string & msg) const { throw Error(f_.path() + ": " + msg); }

private:
    const gguf::Reader & f_;
    Context & ctx_;
    std::vector<Tensor *> & out_;
    std::unordered_set<std::string> used_;
};

} // namespace

std::unique_ptr<Model> Model::load(const std::string & path) {
    std::unique_ptr<Model> m(new Model());
    m->file_ = gguf::Reader::open(path);
    m->hp_ = load_hparams(*m->file_);
    const HParams & hp = m->hp_;
    const ArchTraits & at = *hp.arch;
    const int64_t E = hp.n_embd, V = hp.n_vocab, Q = hp.n_q(), KV = hp.n_kv(), F = hp.n_ff, D = hp.head_dim;

    // The tensors are taken in the order the graph uses them; `weights_` keeps file order below.
    std::vector<Tensor *> taken;
    Loader ld(*m->file_, m->ctx_, taken);
    m->tok_embd = ld.take("token_embd.weight", {E, V}, Role::Matrix);
    m->output_norm = ld.take("output_norm.weight", {E}, Role::Vector);
    if (!at.tied_head) m->output = ld.take("output.weight", {E, V}, Role::Matrix, false);
    if (!m->output) m->output = m->tok_embd;  // tied embeddings (formats.md §3.3)

    // RoPE frequency factors: one tensor for every layer (llama.cpp's TENSOR_DUPLICATED), optional.
    Tensor * rope_freqs = nullptr;
    const int64_t R = hp.n_rot / 2;
    if (at.rope_freqs) rope_freqs = ld.take("rope_freqs.weight", {R}, Role::Vector, false);
    if (at.long_rope) {
        rope_freqs = ld.take("rope_factors_short.weight", {R}, Role::Vector, false);
        m->rope_factors_long = ld.take("rope_factors_long.weight", {R}, Role::Vector, false);
        if (!rope_freqs != !m->rope_factors_long)
            ld.fail(std::string(rope_freqs ? "rope_factors_short" : "rope_factors_long") + ".weight without " +
                    (rope_freqs ? "rope_factors_long" : "rope_factors_short") + ".weight (LongRoPE needs both)");
    }

    m->layers.resize(hp.n_layer);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        LayerWeights & L = m->layers[il];
        const std::string p = "blk." + std::to_string(il) + ".";
        L.rope_freqs = rope_freqs;
        L.attn_norm = ld.take(p + "attn_norm.weight", {E}, Role::Vector);
        if (hp.is_recurrent(il)) {  // qwen35's Gated DeltaNet layer
            const int64_t Hv = hp.ssm_dt_rank, VD = hp.ssm_d_inner, C = hp.ssm_conv_dim();
            L.wqkv = ld.take(p + "attn_qkv.weight", {E, C}, Role::Matrix);
            L.ssm_gate = ld.take(p + "attn_gate.weight", {E, VD}, Role::Matrix);
            L.ssm_conv1d = ld.take(p + "ssm_conv1d.weight", {hp.ssm_d_conv, C}, Role::Vector);
            L.ssm_dt = ld.take(p + "ssm_dt.bias", {Hv}, Role::Vector);
            L.ssm_a = ld.take(p + "ssm_a", {Hv}, Role::Vector);
            L.ssm_beta = ld.take(p + "ssm_beta.weight", {E, Hv}, Role::Matrix);
            L.ssm_alpha = ld.take(p + "ssm_alpha.weight", {E, Hv}, Role::Matrix);
            L.ssm_norm = ld.take(p + "ssm_norm.weight", {hp.ssm_head_v()}, Role::Vector);
            L.ssm_out = ld.take(p + "ssm_out.weight", {VD, E}, Role::Matrix);
        } else if (at.fused_qkv && ld.has(p + "attn_qkv.weight")) {  // phi3: fused, or separate as llama.cpp also accepts
            L.wqkv = ld.take(p + "attn_qkv.weight", {E, Q + 2 * KV}, Role::Matrix);
        } else {
            L.wq = ld.take(p + "attn_q.weight", {E, at.attn_output_gate ? 2 * Q : Q}, Role::Matrix);  // qwen35: q and its gate
            L.wk = ld.take(p + "attn_k.weight", {E, KV}, Role::Matrix);
            L.wv = ld.take(p + "attn_v.weight", {E, KV}, Role::Matrix);
        }
        if (!hp.is_recurrent(il)) {  // attention tensors (a DeltaNet layer has none)
            if (at.qkv_bias) {
                L.bq = ld.take(p + "attn_q.bias", {Q}, Role::Vector);
                L.bk = ld.take(p + "attn_k.bias", {KV}, Role::Vector);
                L.bv = ld.take(p + "attn_v.bias", {KV}, Role::Vector);
            }
            if (at.qk_norm) {
                L.q_norm = ld.take(p + "attn_q_norm.weight", {D}, Role::Vector);
                L.k_norm = ld.take(p + "attn_k_norm.weight", {D}, Role::Vector);
            }
            L.wo = ld.take(p + "attn_output.weight", {Q, E}, Role::Matrix);
            if (at.attn_out_bias) L.bo = ld.take(p + "attn_output.bias", {E}, Role::Vector);
            if (at.attn_sinks) L.attn_sinks = ld.take(p + "attn_sinks.weight", {hp.n_head}, Role::Vector);
        }
        if (at.post_norms) L.attn_post_norm = ld.take(p + "post_attention_norm.weight", {E}, Role::Vector);
        L.ffn_norm = ld.take(p + at.ffn_norm + ".weight", {E}, Role::Vector);
        if (at.moe) {
            const int64_t X = hp.n_expert, FX = hp.n_ff_exp;
            L.ffn_gate_inp = ld.take(p + "ffn_gate_inp.weight", {E, X}, Role::Matrix);
            L.ffn_gate_exps = ld.take(p + "ffn_gate_exps.weight", {E, FX, X}, Role::Matrix);
            L.ffn_up_exps = ld.take(p + "ffn_up_exps.weight", {E, FX, X}, Role::Matrix);
            L.ffn_down_exps = ld.take(p + "ffn_down_exps.weight", {FX, E, X}, Role::Matrix);
            if (at.shared_expert) {
                const int64_t FS = hp.n_ff_shexp;
                L.ffn_gate_inp_shexp = ld.take(p + "ffn_gate_inp_shexp.weight", {E}, Role::Vector);
                L.ffn_gate_shexp = ld.take(p + "ffn_gate_shexp.weight", {E, FS}, Role::Matrix);
                L.ffn_up_shexp = ld.take(p + "ffn_up_shexp.weight", {E, FS}, Role::Matrix);
                L.ffn_down_shexp = ld.take(p + "ffn_down_shexp.weight", {FS, E}, Role::Matrix);
            }
            if (at.moe_biases) {
                L.ffn_gate_inp_b = ld.take(p + "ffn_gate_inp.bias", {X}, Role::Vector);
                L.ffn_gate_exps_b = ld.take(p + "ffn_gate_exps.bias", {FX, X}, Role::Vector);
                L.ffn_up_exps_b = ld.take(p + "ffn_up_exps.bias", {FX, X}, Role::Vector);
                L.ffn_down_exps_b = ld.take(p + "ffn_down_exps.bias", {E, X}, Role::Vector);
            }
        } else if (at.fused_gate_up) {
            L.ffn_up = ld.take(p + "ffn_up.weight", {E, 2 * F}, Role::Matrix);
            L.ffn_down = ld.take(p + "ffn_down.weight", {F, E}, Role::Matrix);
        } else {
            L.ffn_gate = ld.take(p + "ffn_gate.weight", {E, F}, Role::Matrix);
            L.ffn_up = ld.take(p + "ffn_up.weight", {E, F}, Role::Matrix);
            L.ffn_down = ld.take(p + "ffn_down.weight", {F, E}, Role::Matrix);
        }
        if (at.post_norms) L.ffn_post_norm = ld.take(p + "post_ffw_norm.weight", {E}, Role::Vector);
    }
    // Multi-token prediction blocks (qwen35's nextn_predict_layers): kept as the file holds them (merges and conversions
    // write them back) but never built into a graph.
    for (uint32_t il = hp.n_layer; il < hp.n_layer + hp.n_layer_nextn; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        for (const gguf::TensorInfo & t : m->file_->tensors())
            if (t.name.rfind(p, 0) == 0) m->mtp.push_back(ld.take_as_is(t.name));
    }
    ld.check_all_used(hp);

    std::unordered_map<std::string_view, Tensor *> by_name;
    for (Tensor * t : taken) by_name[t->name] = t;
    for (const gguf::TensorInfo & t : m->file_->tensors()) m->weights_.push_back(by_name.at(t.name));
    return m;
}

ModelWeights Model::graph_weights(int64_t n_ctx) const {
    ModelWeights w{tok_embd, output_norm, output, layers};
    if (rope_factors_long && n_ctx > static_cast<int64_t>(hp_.rope_n_ctx_orig))
        for (LayerWeights & l : w.layers) l.rope_freqs = rope_factors_long;
    return w;
}

Tensor * Model::find(std::string_view name) const {
    for (Tensor * t : weights_)
        if (t->name == name) return t;
    return nullptr;
}

int64_t Model::n_params() const {
    int64_t n = 0;
    for (const Tensor * t : weights_) n += t->nelements();
    return n;
}

} // namespace rp
