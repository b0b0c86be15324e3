#include "models/convert/merge_lora.h"

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/quant.h"
#include "base/error.h"
#include "gguf/gguf.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"
#include "models/convert/quantize_model.h"

#include <cmath>
#include <memory>
#include <set>

namespace rp {

void merge_lora(const std::string & base_path, const std::vector<MergeInput> & inputs, const std::string & out_path,
                const MergeOptions & opt) {
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
    std::vector<QuantChoice> plan;
    if (opt.mix) {
        plan = plan_quant_mix(f, *opt.mix, false);
        w.set_u32("general.quantization_version", 2);
        w.set_u32("general.file_type", opt.mix->file_type);
    }
    const auto name_of = [](TensorType t) { return std::string(gguf::type_name(static_cast<uint32_t>(t))); };
    for (size_t ix = 0; ix < f.tensors().size(); ++ix) {
        const gguf::TensorInfo & ti = f.tensors()[ix];
        const TensorType to = opt.mix ? plan[ix].type : ti.type;
        const bool merged = targets.count(ti.name) != 0;
        if (!merged && to == ti.type) {
            w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, f.tensor_data(ti));
            continue;
        }
        if (!can_quantize(to))
            throw Error(base_path + ": tensor '" + ti.name + "' is " + name_of(ti.type) +
                        ", a type rp-merge-lora cannot write; choose the output's type (--type q8_0, q4_k_m, f16, ...)");
        // Computed when the writer stores the tensor: one merged tensor in memory at a time.
        const gguf::TensorInfo info = ti;
        w.add_tensor(ti.name, to, ti.n_dims, ti.ne, [&, info, to, merged](uint8_t * dst, size_t) {
            const int64_t n0 = info.ne[0], n1 = info.nelements() / info.ne[0];
            std::vector<float> wf;
            if (merged) {
                wf = tensor_get_f32(model->find(info.name));  // dequantized
            } else {  // re-typed by the mix only
                wf.resize(static_cast<size_t>(info.nelements()));
                dequantize_row(info.type, f.tensor_data(info), wf.data(), info.nelements());
            }
            for (size_t i = 0; merged && i < ads.size(); ++i) {
                const LoraTensor & lt = *ads[i]->find(info.name);
                const float sc = ads[i]->scale(lt, inputs[i].scale);
                const std::vector<float> A = tensor_get_f32(lt.a), B = tensor_get_f32(lt.b);
                const int64_t r = lt.rank();
                // Expert tensors hold n_x = ne[2] matrices of [n0, n_out], each with its own pair (n_x = 1 otherwise).
                const int64_t n_x = info.ne[2], n_out = n1 / n_x;
                std::vector<float> dw(wf.size(), 0.0f);
                for (int64_t x = 0; x < n_x; ++x) {
                    const float * Ax = A.data() + x * n0 * r;
                    const float * Bx = B.data() + x * r * n_out;
                    for (int64_t o = 0; o < n_out; ++o)      // embedding: o = token v, i = feature j
                        for (int64_t k = 0; k < r; ++k) {
                            // normal: dW[i, o] = sum_k A[i, k] B[k, o]; token_embd: dE[j, v] = sum_k B[k, j] A[k, v]
                            const float c = lt.embedding ? Ax[o * r + k] : Bx[o * r + k];
                            float * row = &dw[static_cast<size_t>((x * n_out + o) * n0)];
                            for (int64_t i2 = 0; i2 < n0; ++i2) row[i2] += c * (lt.embedding ? Bx[i2 * r + k] : Ax[k * n0 + i2]);
                        }
                }
                for (size_t e = 0; e < wf.size(); ++e) wf[e] += sc * dw[e];
            }
            for (size_t e = 0; e < wf.size(); ++e)
                if (!std::isfinite(wf[e]))
                    throw Error("merge: tensor '" + info.name + "' element " + std::to_string(e) +
                                " is not finite after the merge (a diverged adapter?); nothing written");
            quantize_rows(to, wf.data(), dst, n0, n1, opt.threads);
        });
    }
    w.write(out_path);
}

} // namespace rp
