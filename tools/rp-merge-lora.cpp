// rp-merge-lora: merges LoRA adapters into their base model like llama.cpp's llama-export-lora
// (formats.md §5.5; models/merge_lora.h), keeping the base's tensor types or quantizing to a mix.
//
//   rp-merge-lora -m BASE.gguf --lora A.gguf[:SCALE] [--lora B.gguf[:SCALE] ...] -o OUT.gguf [--type T]
#include "tools/check_options.h"

#include "base/error.h"

#include <cstdio>
#include <string>

int main(int argc, char ** argv) {
    try {
        rp::cli::MergeSettings s;
        rp::cli::Options opts("rp-merge-lora", "usage: rp-merge-lora -m BASE.gguf --lora ADAPTER.gguf[:SCALE] [...] -o OUT.gguf [--type T]");
        rp::cli::declare_merge_lora_options(opts, s);
        if (!opts.parse(argc, argv)) return 0;
        s.validate();
        rp::merge_lora(s.base, s.adapters, s.out, s.merge);
        std::fprintf(stderr, "wrote %s\n", s.out.c_str());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
