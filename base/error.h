// The one error type of ggml-rp, shared by every library (gguf, ggml_rp, models) and the tools. Library code
// throws rp::Error on bad input (a broken file, a wrong shape, a bad parameter) with a message naming the file,
// key, tensor or parameter at fault; it never aborts the process. assert() is reserved for programming errors.
// Libraries name their own parameters ("lora_rank", "seq_len"); the tools map them to their flags.
#pragma once

#include <stdexcept>
#include <string>

namespace rp {

// Default visibility: the CUDA plugin (a dlopen'd shared object) throws it and the tools catch it.
struct __attribute__((visibility("default"))) Error : std::runtime_error {
    explicit Error(const std::string & what) : std::runtime_error(what) {}
};

} // namespace rp
