// gen_synth: writes a random-weight model of any llama / qwen2 / qwen3 shape through the synthetic-model writer
// (tests/live/synth_model.h), for the finetuning benchmark of tools/gpu-check.sh (a Qwen3-1.7B shape). Built by
// that script against a build's static libraries, like bench/infer/gen_model.cpp:
//   gen_synth OUT.gguf VOCAB.gguf ARCH N_EMBD N_HEAD N_HEAD_KV HEAD_DIM N_FF N_LAYER TIED(0|1) WTYPE(f32|f16|bf16)
// Prints the parameter count it wrote (read back from the file) as "params N" on stdout.
#include "gguf/gguf.h"
#include "tests/live/synth_model.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

int main(int argc, char ** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: gen_synth OUT.gguf VOCAB.gguf ARCH N_EMBD N_HEAD N_HEAD_KV HEAD_DIM N_FF N_LAYER "
                             "TIED(0|1) WTYPE(f32|f16|bf16)\n");
        return 1;
    }
    try {
        auto u32 = [](const char * s) { return static_cast<uint32_t>(std::strtoul(s, nullptr, 10)); };
        rp::live::SynthSpec s;
        s.vocab_from = argv[2];
        s.arch = argv[3];
        s.n_embd = u32(argv[4]);
        s.n_head = u32(argv[5]);
        s.n_head_kv = u32(argv[6]);
        s.head_dim = u32(argv[7]);
        s.n_ff = u32(argv[8]);
        s.n_layer = u32(argv[9]);
        s.tied = std::string(argv[10]) == "1";
        const std::string wt = argv[11];
        if (wt == "f32") s.wtype = gguf::TensorType::F32;
        else if (wt == "f16") s.wtype = gguf::TensorType::F16;
        else if (wt == "bf16") s.wtype = gguf::TensorType::BF16;
        else throw std::runtime_error("WTYPE must be f32, f16 or bf16, got '" + wt + "'");
        if (s.n_embd == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.head_dim == 0 || s.n_ff == 0 || s.n_layer == 0)
            throw std::runtime_error("every size must be a positive integer");
        s.n_ctx_train = 4096;
        s.rope_base = 1000000.0f;
        s.seed = 42;
        rp::live::write_synth_model(s, argv[1]);
        int64_t n_params = 0;
        for (const gguf::TensorInfo & t : gguf::Reader::open(argv[1])->tensors()) n_params += t.nelements();
        std::printf("params %lld\n", static_cast<long long>(n_params));
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
