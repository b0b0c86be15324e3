// Re-typing a whole GGUF model to a quantization mix (quant_mix.h), as llama-quantize does: each tensor the
// mix re-types is dequantized to f32 row by row and quantized with quant.cpp; the others are copied as they
// are. The metadata is copied, general.file_type and general.quantization_version are set. Written to a
// temporary file and renamed: on any error nothing is left at the output path.
#pragma once

#include "gguf/gguf.h"
#include "models/convert/quant_mix.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rp {

struct QuantizeOptions {
    QuantMix mix;
    bool pure = false;  // every quantizable tensor gets mix.base (row-length fallbacks still apply)
    int threads = 1;    // rows are quantized in parallel; the bytes do not depend on the count
};

struct QuantizeReport {
    std::map<std::string, int> tensors_by_type;  // output type name -> count
    std::vector<std::string> notes;              // fallbacks and tensors copied because they cannot be read
    uint64_t bytes_in = 0, bytes_out = 0;        // tensor data, without metadata or padding
};

// Throws rp::Error naming the file (and tensor) for an unreadable input, an unsupported architecture, or a
// tensor whose type cannot be dequantized but that the mix would re-type.
QuantizeReport quantize_model(const std::string & in, const std::string & out, const QuantizeOptions & opt);

// The mix's rules on the model in `file` (its hyper-parameters and tensor list).
std::vector<QuantChoice> plan_quant_mix(const gguf::Reader & file, const QuantMix & mix, bool pure);

} // namespace rp
