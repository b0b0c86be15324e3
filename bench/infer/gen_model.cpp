// gen_model: writes the random-weight ~100M-parameter llama used by bench-infer.sh (and, with arguments, any
// other synthetic shape) through our GGUF writer. Built by bench-infer.sh against a build's libraries:
//   gen_model OUT.gguf VOCAB.gguf [n_embd n_head n_head_kv n_ff n_layer]
// Defaults: 768, 12, 4, 2560, 13 (head_dim 64, GQA 3:1): 97.9M parameters with the 512-token stories260K vocab.
// bench/finetune/vs-llamacpp.sh uses 512 8 8 1408 6: 19.8M parameters. Prints the parameter count it wrote.
#include "gguf/gguf.h"
#include "tests/live/synth_model.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

int main(int argc, char ** argv) {
    if (argc != 3 && argc != 8) {
        std::fprintf(stderr, "usage: gen_model OUT.gguf VOCAB.gguf [n_embd n_head n_head_kv n_ff n_layer]\n");
        return 1;
    }
    try {
        rp::live::SynthSpec s;
        s.arch = "llama";
        s.vocab_from = argv[2];
        s.n_embd = 768, s.n_head = 12, s.n_head_kv = 4, s.n_ff = 2560, s.n_layer = 13;
        if (argc == 8) {
            s.n_embd = static_cast<uint32_t>(std::atoi(argv[3]));
            s.n_head = static_cast<uint32_t>(std::atoi(argv[4]));
            s.n_head_kv = static_cast<uint32_t>(std::atoi(argv[5]));
            s.n_ff = static_cast<uint32_t>(std::atoi(argv[6]));
            s.n_layer = static_cast<uint32_t>(std::atoi(argv[7]));
        }
        if (s.n_head == 0 || s.n_head_kv == 0 || s.n_embd % s.n_head != 0) {
            std::fprintf(stderr, "error: n_embd must be a positive multiple of n_head\n");
            return 1;
        }
        s.head_dim = s.n_embd / s.n_head;
        s.n_ctx_train = 2048;
        s.seed = 42;
        rp::live::write_synth_model(s, argv[1]);
        int64_t n_params = 0;  // read back from the file, so the figure is what the engines will train
        for (const gguf::TensorInfo & t : gguf::Reader::open(argv[1])->tensors()) n_params += t.nelements();
        std::printf("%s: %lld parameters (%.1fM)\n", argv[1], static_cast<long long>(n_params),
                    static_cast<double>(n_params) / 1e6);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
