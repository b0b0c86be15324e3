// Mistral's older models are llama files (#34): Mistral Nemo's shape (head_dim 128 over n_embd 5120 / 32
// heads = 160: the head size is not n_embd / n_head), its RoPE base of 1e6 and its tekken vocabulary, run as
// llama.cpp runs them, here scaled down (head_dim 16 over n_embd 96 / 4 heads = 24): every position's
// logits within llama.cpp's float bound, the greedy continuation equal, and the prompt tokenized as llama.cpp
// tokenizes it.
#include "arch_test_util.h"

#include <gtest/gtest.h>

using namespace models_test;

namespace {

// A vocabulary with tekken's pre-tokenizer (llama-bpe's 128k tokens, tokenizer.ggml.pre = "tekken").
std::string tekken_vocab(TempDir & d) {
    Variant v;
    v.edit_kvs = [](gguf::Writer & w) { w.set_string("tokenizer.ggml.pre", "tekken"); };
    write_variant(model_path("vocab/ggml-vocab-llama-bpe.gguf"), d.file("tekken.gguf"), v);
    return d.file("tekken.gguf");
}

rp::SynthSpec nemo_like(const std::string & vocab, uint64_t seed) {
    rp::SynthSpec s;
    s.arch = "llama";
    s.vocab_from = vocab;
    s.n_embd = 96, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 128, s.n_layer = 3, s.tied = true;
    s.n_ctx_train = 4096, s.rope_base = 1e6f, s.seed = seed;
    return s;
}

} // namespace

TEST(Mistral, NemoShapedLlamaEqualsLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("nemo.gguf");
    rp::write_synth_model(nemo_like(tekken_vocab(d), 21), file);
    const auto model = rp::Model::load(file);
    EXPECT_EQ(model->hparams().head_dim, 16u);
    EXPECT_NE(model->hparams().head_dim * model->hparams().n_head, model->hparams().n_embd);
    for (size_t n : {1, 40}) EXPECT_LE(compare_logits("mistral", file, some_tokens(n, 7, 100000), "nemo-shaped llama"), 1e-4);
    expect_greedy_equals_llama_cpp(file, "Once upon a time there was a little robot who", 16);
}
