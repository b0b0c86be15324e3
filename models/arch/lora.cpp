#include "models/arch/lora.h"

#include "models/arch/model.h"

#include <cstring>
#include <map>

namespace rp {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// [ne0, ne1] or, for expert tensors, [ne0, ne1, ne2].
std::string shape2(const Tensor * t) {
    std::string s = "[";  // built by appending: g++ 12 warns (-Wrestrict) on "literal" + std::string&&
    s += std::to_string(t->ne[0]);
    s += ", ";
    s += std::to_string(t->ne[1]);
    if (t->ne[2] != 1) {
        s += ", ";
        s += std::to_string(t->ne[2]);
    }
    s += "]";
    return s;
}

// llama.cpp looks adapters up by tensor name, and a tied LM head *is* token_embd: it would apply the
// embedding-shaped pair to the head matmul too and abort (seen with the reference build). We refuse it.
std::string tied_embd_msg(const Model & m) {
    return "'token_embd.weight': " + m.path() +
           " ties the LM head to token_embd, and llama.cpp would apply this pair to the head as well (it aborts "
           "on such adapters); LoRA on token_embd of a tied model is not supported";
}

bool adapter_type_ok(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0;
}

} // namespace

std::unique_ptr<LoraAdapter> LoraAdapter::load(const std::string & path, const Model & model) {
    std::unique_ptr<LoraAdapter> ad(new LoraAdapter());
    ad->file_ = gguf::Reader::open(path);
    const gguf::Reader & f = *ad->file_;
    ad->path_ = path;
    auto fail = [&](const std::string & msg) -> void { throw Error(path + ": " + msg); };

    // Metadata, checked in llama.cpp's order (llama_adapter_lora_init).
    const std::string type = f.get_string_or("general.type", "");
    if (type != "adapter")
        fail((type.empty() ? std::string("no general.type key") : "general.type is '" + type + "'") +
             ", expected 'adapter' (is this a model, not a LoRA adapter?)");
    ad->arch_ = f.get_string_or("general.architecture", "");
    const std::string model_arch = model.hparams().arch->name;
    if (ad->arch_ != model_arch)
        fail("general.architecture is '" + ad->arch_ + "' but the base model " + model.path() + " is '" + model_arch +
             "' (adapter for another base model?)");
    const std::string atype = f.get_string_or("adapter.type", "");
    if (atype != "lora") fail("adapter.type is '" + atype + "', expected 'lora'");
    ad->alpha_ = f.get_f32_or("adapter.lora.alpha", 0.0f);

    // Pair the tensors by base name (sorted, so the pairs have a stable order whatever the file order).
    struct Pair { const gguf::TensorInfo * a = nullptr; const gguf::TensorInfo * b = nullptr; };
    std::map<std::string, Pair> pairs;
    std::vector<std::string> order;
    for (const gguf::TensorInfo & t : f.tensors()) {
        std::string base;
        const bool is_a = ends_with(t.name, ".lora_a"), is_b = ends_with(t.name, ".lora_b");
        if (is_a || is_b) {
            base = t.name.substr(0, t.name.size() - 7);
        } else if (ends_with(t.name, "_norm.weight")) {
            continue;  // llama.cpp accepts and ignores norm tensors in adapters
        } else {
            fail("tensor '" + t.name + "' has an unexpected suffix (expected .lora_a or .lora_b)");
        }
        if (!adapter_type_ok(t.type))
            fail("tensor '" + t.name + "' has type " + dtype_name(t.type) + " (adapters must be f32, f16, bf16 or q8_0)");
        if (t.n_dims > 3) fail("tensor '" + t.name + "' has " + std::to_string(t.n_dims) + " dimensions, expected 2 (3 for experts)");
        if (!pairs.count(base)) order.push_back(base);
        (is_a ? pairs[base].a : pairs[base].b) = &t;
    }

    for (const std::string & base : order) {
        const Pair & p = pairs[base];
        if (!p.a || !p.b) fail("tensor pair for '" + base + "' is missing its " + (p.a ? "lora_b" : "lora_a") + " half");
        Tensor * w = model.find(base);
        if (!w) fail("tensor '" + base + "' does not exist in the base model " + model.path() + " (adapter for another base model?)");

        if (base == "token_embd.weight" && model.tied_output())
            fail(tied_embd_msg(model));
        LoraTensor lt;
        lt.base = base;
        lt.base_weight = w;
        lt.embedding = base == "token_embd.weight";
        lt.a = ad->ctx_.new_tensor(p.a->type, p.a->ne);
        lt.b = ad->ctx_.new_tensor(p.b->type, p.b->ne);
        lt.a->name = p.a->name;
        lt.b->name = p.b->name;
        const std::string shapes = "lora_a " + shape2(lt.a) + ", lora_b " + shape2(lt.b) + " for base " + shape2(w);
        if (lt.embedding) {
            // Roles swapped: A is gathered per token ([r, n_vocab]), B maps r -> n_embd ([r, n_embd]).
            if (w->ne[0] != lt.b->ne[1] || w->ne[1] != lt.a->ne[1] || lt.a->ne[0] != lt.b->ne[0])
                fail("tensor '" + base + "' has incorrect shapes: " + shapes +
                     " (token_embd expects lora_a [r, n_vocab], lora_b [r, n_embd]; adapter for another base model?)");
        } else {
            if (w->ne[0] != lt.a->ne[0] || w->ne[1] != lt.b->ne[1])
                fail("tensor '" + base + "' has incorrect shapes: " + shapes +
                     " (expected lora_a [n_in, r], lora_b [r, n_out]; adapter for another base model?)");
            if (lt.a->ne[1] != lt.b->ne[0])
                fail("tensor '" + base + "': lora_a tensor is not transposed: " + shapes + " (rank mismatch)");
            // Expert tensors [n_in, n_out, n_expert]: one pair per expert (llama.cpp's mul_mat_id of A, then B).
            if (lt.a->ne[2] != w->ne[2] || lt.b->ne[2] != w->ne[2])
                fail("tensor '" + base + "' has incorrect shapes: " + shapes + " (expert weights need lora_a [n_in, r, " +
                     std::to_string(w->ne[2]) + "], lora_b [r, n_out, " + std::to_string(w->ne[2]) + "])");
        }
        // Adapters are small: copy them into writable memory so that training can continue from a loaded one.
        std::memcpy(ad->ctx_.alloc_data(lt.a), f.tensor_data(*p.a), p.a->nbytes);
        std::memcpy(ad->ctx_.alloc_data(lt.b), f.tensor_data(*p.b), p.b->nbytes);
        ad->tensors_.push_back(lt);
    }
    if (ad->tensors_.empty()) fail("the adapter has no lora_a / lora_b tensors");
    ad->file_.reset();  // everything is copied; do not keep the file open
    return ad;
}

std::unique_ptr<LoraAdapter> LoraAdapter::create(const Model & model, const std::vector<std::string> & targets,
                                                 int64_t rank, float alpha, bool allocate) {
    if (rank < 1) throw Error("LoRA rank must be >= 1 (got " + std::to_string(rank) + ")");
    std::unique_ptr<LoraAdapter> ad(new LoraAdapter());
    ad->arch_ = model.hparams().arch->name;
    ad->alpha_ = alpha;
    for (const std::string & base : targets) {
        if (ad->find(base)) throw Error("LoRA target '" + base + "' is listed twice");
        Tensor * w = model.find(base);
        if (!w) {
            if (base == "output.weight" && model.tied_output())
                throw Error("LoRA target 'output.weight': " + model.path() +
                            " ties the LM head to token_embd; a separate adapter tensor cannot express it");
            throw Error("LoRA target '" + base + "' is not a tensor of " + model.path());
        }
        if (base == "token_embd.weight" && model.tied_output()) throw Error("LoRA target " + tied_embd_msg(model));
        if (w->ne[1] == 1 || w->ne[3] != 1 || (w->ne[2] != 1 && base == "token_embd.weight"))
            throw Error("LoRA target '" + base + "' " + describe(w) + " is not a weight matrix (or a stack of experts' matrices)");
        LoraTensor lt;
        lt.base = base;
        lt.base_weight = w;
        lt.embedding = base == "token_embd.weight";
        if (lt.embedding) {
            lt.a = ad->ctx_.new_tensor(DType::F32, rank, w->ne[1]);
            lt.b = ad->ctx_.new_tensor(DType::F32, rank, w->ne[0]);
        } else {  // experts: one pair per expert, stacked like the base ([.., .., n_expert])
            lt.a = ad->ctx_.new_tensor(DType::F32, w->ne[0], rank, w->ne[2]);
            lt.b = ad->ctx_.new_tensor(DType::F32, rank, w->ne[1], w->ne[2]);
        }
        lt.a->name = base + ".lora_a";
        lt.b->name = base + ".lora_b";
        if (allocate) {
            ad->ctx_.alloc_data(lt.a);
            ad->ctx_.alloc_data(lt.b);
        }
        ad->tensors_.push_back(lt);
    }
    return ad;
}

void LoraAdapter::save(const std::string & out_path) const {
    gguf::Writer w;
    w.set_string("general.architecture", arch_);
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", alpha_);
    for (const LoraTensor & t : tensors_) {
        for (const Tensor * x : {t.a, t.b}) {
            const int64_t ne[3] = {x->ne[0], x->ne[1], x->ne[2]};
            w.add_tensor(x->name, x->type, x->ne[2] != 1 ? 3 : 2, ne, x->data);
        }
    }
    w.write(out_path);
}

const LoraTensor * LoraAdapter::find(std::string_view base) const {
    for (const LoraTensor & t : tensors_)
        if (t.base == base) return &t;
    return nullptr;
}

float LoraAdapter::scale(const LoraTensor & t, float user_scale) const {
    return alpha_ != 0.0f ? user_scale * alpha_ / static_cast<float>(t.rank()) : user_scale;
}

} // namespace rp
