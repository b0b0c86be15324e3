// quantize_model.h: the mix's choices, then one pass over the tensors writing each in its chosen type.
#include "models/convert/quantize_model.h"

#include "base/error.h"
#include "ggml_rp/core/quant.h"
#include "models/arch/hparams.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

namespace rp {

namespace {

bool is_quantized_type(TensorType t) { return gguf::type_traits(static_cast<uint32_t>(t))->block_size > 1; }

} // namespace

std::vector<QuantChoice> plan_quant_mix(const gguf::Reader & file, const QuantMix & mix, bool pure) {
    const HParams hp = load_hparams(file);
    QuantMixModel m;
    m.arch = hp.arch->name;
    m.n_layer = hp.n_layer + hp.n_layer_nextn;  // llama-quantize's layer rules count the file's blocks, MTP ones too
    m.n_head = hp.n_head;
    m.n_head_kv = hp.n_head_kv;
    m.n_expert = hp.n_expert;  // (the rules of llama.cpp's 8-expert models, and the layer of an expert tensor by its name)
    std::vector<QuantTensor> ts;
    for (const gguf::TensorInfo & t : file.tensors()) ts.push_back({t.name, static_cast<int>(t.n_dims), t.ne[0], t.type});
    return plan_quant_mix(mix, m, ts, pure);
}

QuantizeReport quantize_model(const std::string & in, const std::string & out, const QuantizeOptions & opt) {
    const std::unique_ptr<gguf::Reader> r = gguf::Reader::open(in);
    const std::vector<QuantChoice> plan = plan_quant_mix(*r, opt.mix, opt.pure);
    gguf::Writer w(r->alignment());
    gguf::copy_kvs(*r, w);
    w.set_u32("general.quantization_version", 2);  // ggml's GGML_QNT_VERSION, set by llama-quantize for every type
    w.set_u32("general.file_type", opt.mix.file_type);

    QuantizeReport rep;
    const gguf::Reader * reader = r.get();
    const int threads = opt.threads < 1 ? 1 : opt.threads;
    for (size_t i = 0; i < r->tensors().size(); ++i) {
        const gguf::TensorInfo & t = r->tensors()[i];
        const QuantChoice & c = plan[i];
        if (!c.note.empty()) rep.notes.push_back(c.note);
        rep.tensors_by_type[gguf::type_name(static_cast<uint32_t>(c.type))]++;
        rep.bytes_in += t.nbytes;
        const int64_t rows = t.nelements() / t.ne[0];
        rep.bytes_out += gguf::row_bytes(c.type, t.ne[0]) * static_cast<uint64_t>(rows);
        if (c.type == t.type) {  // as llama-quantize: a tensor already in its type is copied, not re-quantized
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
            continue;
        }
        if (is_quantized_type(t.type))
            rep.notes.push_back(t.name + ": re-quantized from " + gguf::type_name(static_cast<uint32_t>(t.type)) +
                                " (the errors add up; llama-quantize refuses this without --allow-requantize)");
        if (!can_dequantize(t.type))
            throw Error(in + ": tensor '" + t.name + "' has type " + gguf::type_name(static_cast<uint32_t>(t.type)) +
                        ", which cannot be dequantized to re-type it to " + gguf::type_name(static_cast<uint32_t>(c.type)));
        const gguf::TensorInfo src = t;
        const TensorType to = c.type;
        w.add_tensor(t.name, to, t.n_dims, t.ne, [reader, src, to, rows, threads](uint8_t * dst, size_t) {
            const uint8_t * data = reader->tensor_data(src);
            const size_t in_rb = gguf::row_bytes(src.type, src.ne[0]);
            const size_t out_rb = gguf::row_bytes(to, src.ne[0]);
            // Each row is independent (every type's blocks lie within a row), so the bytes do not depend
            // on how rows are shared among threads.
            std::atomic<int64_t> first_bad{rows};  // the first row holding a NaN or an infinity
#pragma omp parallel num_threads(threads)
            {
                std::vector<float> row(static_cast<size_t>(src.ne[0]));
#pragma omp for schedule(static)
                for (int64_t ir = 0; ir < rows; ++ir) {
                    dequantize_row(src.type, data + static_cast<size_t>(ir) * in_rb, row.data(), src.ne[0]);
                    for (float v : row) {
                        if (!std::isfinite(v)) {
                            int64_t seen = first_bad.load();
                            while (ir < seen && !first_bad.compare_exchange_weak(seen, ir)) {}
                            break;
                        }
                    }
                    quantize_row(to, row.data(), dst + static_cast<size_t>(ir) * out_rb, src.ne[0]);
                }
            }
            if (first_bad.load() < rows)
                throw Error(reader->path() + ": tensor '" + src.name + "' row " + std::to_string(first_bad.load()) +
                            " holds a NaN or an infinity; a quantized file of it would be garbage");
        });
    }
    w.write(out);
    return rep;
}

} // namespace rp
