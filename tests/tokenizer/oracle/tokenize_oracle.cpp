// rp-tokenize-oracle: llama.cpp's own tokenizer (prebuilt libllama, see docs/reference-oracle.md) on a
// batch of strings, for the differential test in tests/tokenizer/test_oracle_diff.cpp. Built only when the
// oracle libraries are present (tests/tokenizer/extra.cmake).
//
//   rp-tokenize-oracle BACKEND_DIR MODEL.gguf IN OUT
//
// IN holds records [u32 flags][u32 n][n bytes]; flags bit 0 add_special, 1 parse_special, 2 remove_special,
// 3 unparse_special. OUT receives per record [u32 n_ids][n_ids x i32 ids][u32 m][m bytes], the bytes being
// llama_detokenize of those ids with the record's remove_special / unparse_special. Exit 1 on any failure.
#include "ggml-backend.h"
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static bool read_u32(const std::string & s, size_t & at, uint32_t & v) {
    if (at + 4 > s.size()) return false;
    v = uint32_t((unsigned char) s[at]) | uint32_t((unsigned char) s[at + 1]) << 8 |
        uint32_t((unsigned char) s[at + 2]) << 16 | uint32_t((unsigned char) s[at + 3]) << 24;
    at += 4;
    return true;
}

static void put_u32(std::string & o, uint32_t v) {
    for (int i = 0; i < 4; ++i) o += char((v >> (8 * i)) & 0xFF);
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: rp-tokenize-oracle BACKEND_DIR MODEL.gguf IN OUT\n");
        return 1;
    }
    ggml_backend_load_all_from_path(argv[1]);
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[2], mp);
    if (!model) {
        std::fprintf(stderr, "error: cannot load %s\n", argv[2]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[3], std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), {});
    std::string out;
    size_t at = 0;
    while (at < data.size()) {
        uint32_t flags = 0, n = 0;
        if (!read_u32(data, at, flags) || !read_u32(data, at, n) || at + n > data.size()) {
            std::fprintf(stderr, "error: malformed input at byte %zu\n", at);
            return 1;
        }
        const std::string text = data.substr(at, n);
        at += n;
        std::vector<llama_token> ids(text.size() + 16);
        int k = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), flags & 1, flags & 2);
        if (k < 0) {  // too small (a malformed byte can become 3 tokens): -k is the size needed
            ids.resize((size_t) -k);
            k = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), flags & 1, flags & 2);
        }
        if (k < 0) {
            std::fprintf(stderr, "error: llama_tokenize failed\n");
            return 1;
        }
        ids.resize(k);
        put_u32(out, (uint32_t) k);
        for (llama_token t : ids) put_u32(out, (uint32_t) t);
        std::vector<char> buf(text.size() * 4 + 1024);
        int m = llama_detokenize(vocab, ids.data(), k, buf.data(), (int) buf.size(), flags & 4, flags & 8);
        if (m < 0) {
            buf.resize((size_t) -m);
            m = llama_detokenize(vocab, ids.data(), k, buf.data(), (int) buf.size(), flags & 4, flags & 8);
        }
        if (m < 0) {
            std::fprintf(stderr, "error: llama_detokenize failed\n");
            return 1;
        }
        put_u32(out, (uint32_t) m);
        out.append(buf.data(), (size_t) m);
    }
    std::ofstream o(argv[4], std::ios::binary);
    o.write(out.data(), (std::streamsize) out.size());
    llama_model_free(model);
    llama_backend_free();
    return o.good() ? 0 : 1;
}
