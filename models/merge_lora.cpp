#include "models/merge_lora.h"

#include "ggml_rp/core/context.h"
#include "base/error.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/model.h"

#include <memory>
#include <set>

namespace rp {

void merge_lora(const std::string & base_path, const std::vector<MergeInput> & inputs, const std::string & out_path,
                std::optional<DType> out_type) {
    if (inputs.empty()) throw Error("merge_lora: no adapter given");
    auto model = Model::load(base_path);
    std::vector<std::unique_ptr<LoraAdapter>> ads;
    std::set<std::string> targets;
    for (size_t i = 0; i < inputs.size(); ++i) {
        ads.push_back(LoraAdapter::load(inputs[i].path, *model));
        std::set<std::string> t;
        for (const LoraTensor & lt : ads.back()->tensors()) {
            for (const Tensor * x : {lt.a, lt.b})
                if (x->type != DType::F32 && x->type != DType::F16 && x->type != DType::BF16)
                    throw Error(inputs[i].path + ": tensor '" + x->name + "' is " + dtype_name(x->type) +
                                "; quantized adapters cannot be merged (retry with an f16 or f32 adapter)");
            t.insert(lt.base);
        }
        if (i == 0) targets = t;
        else if (t != targets)
            throw Error(inputs[i].path + ": targets other tensors than " + inputs[0].path +
                        " (adapters merged together must adapt the same tensors; merge them one by one)");
    }

    const gguf::Reader & f = model->file();
    gguf::Writer w;
    for (const gguf::KV & kv : f.kvs())
        if (kv.key != "general.alignment") w.set_kv(kv);
    w.set_u32("general.file_type", 1);  // MOSTLY_F16, as llama-export-lora sets it
    Context tmp;
    for (const gguf::TensorInfo & ti : f.tensors()) {
        if (!targets.count(ti.name)) {
            w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, f.tensor_data(ti));
            continue;
        }
        const Tensor * base = model->find(ti.name);
        std::vector<float> wf = tensor_get_f32(base);  // dequantized
        const int64_t n0 = ti.ne[0], n1 = ti.ne[1];
        for (size_t i = 0; i < ads.size(); ++i) {
            const LoraTensor & lt = *ads[i]->find(ti.name);
            const float sc = ads[i]->scale(lt, inputs[i].scale);
            const std::vector<float> A = tensor_get_f32(lt.a), B = tensor_get_f32(lt.b);
            const int64_t r = lt.rank();
            std::vector<float> dw(wf.size(), 0.0f);
            for (int64_t o = 0; o < n1; ++o)      // embedding: o = token v, i = feature j
                for (int64_t k = 0; k < r; ++k) {
                    // normal: dW[i, o] = sum_k A[i, k] B[k, o]; token_embd: dE[j, v] = sum_k B[k, j] A[k, v]
                    const float c = lt.embedding ? A[static_cast<size_t>(o * r + k)] : B[static_cast<size_t>(o * r + k)];
                    float * row = &dw[static_cast<size_t>(o * n0)];
                    for (int64_t i2 = 0; i2 < n0; ++i2)
                        row[i2] += c * (lt.embedding ? B[static_cast<size_t>(i2 * r + k)] : A[static_cast<size_t>(k * n0 + i2)]);
                }
            for (size_t e = 0; e < wf.size(); ++e) wf[e] += sc * dw[e];
        }
        const DType t = out_type ? *out_type : (ti.type == DType::F32 ? DType::F32 : DType::F16);
        if (n0 % dtype_block_size(t) != 0)
            throw Error("output type " + std::string(dtype_name(t)) + ": tensor '" + ti.name + "' has rows of " +
                        std::to_string(n0) + " values, not a multiple of the block size " +
                        std::to_string(dtype_block_size(t)));
        Tensor * out = tmp.new_tensor(t, ti.ne);
        tmp.alloc_data(out);
        tensor_set_f32(out, wf);
        w.add_tensor(ti.name, t, ti.n_dims, ti.ne, out->data);
    }
    w.write(out_path);
}

} // namespace rp
