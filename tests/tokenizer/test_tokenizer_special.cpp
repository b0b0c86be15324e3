// BOS / special tokens / pieces / offsets / errors. Expectations come from MANIFEST.md, the oracle files
// in shared/models/reference (tokens and pieces printed by llama.cpp), ids read off the vocabulary files,
// and llama.cpp's documented rules (formats.md §4) applied by hand.
#include <unistd.h>
#include "tok_test_util.h"

#include "base/error.h"
#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>

using namespace tok_test;

namespace {

// "tokens(N): a b c" and "pieces: [x] [y] [z]" lines of an oracle file.
struct Oracle {
    std::vector<int32_t> tokens;
    std::vector<std::string> pieces;
};

Oracle read_oracle(const std::string & path) {
    Oracle o;
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("tokens(", 0) == 0) {
            std::istringstream ls(line.substr(line.find(':') + 1));
            int v;
            while (ls >> v) {
                o.tokens.push_back(v);
            }
        } else if (line.rfind("pieces: [", 0) == 0) {
            std::string body = line.substr(9, line.size() - 10);  // between the outer brackets
            size_t pos = 0;
            while (true) {
                const size_t e = body.find("] [", pos);
                o.pieces.push_back(body.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
                if (e == std::string::npos) {
                    break;
                }
                pos = e + 3;
            }
        }
    }
    return o;
}

TEST(TokenizerPrompts, Prompt1Stories260K) {
    const rp::Tokenizer & tok = *load_cached(models_dir() + "/stories260K.gguf").tok;
    const std::string text = read_file(models_dir() + "/reference/prompt1.txt");
    const std::vector<int32_t> manifest = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
    const Oracle o = read_oracle(models_dir() + "/reference/stories260K.prompt1.oracle.txt");
    EXPECT_EQ(o.tokens, manifest);
    EXPECT_TRUE(tok.add_bos());
    EXPECT_TRUE(tok.add_space_prefix());
    const std::vector<int32_t> ids = tok.encode(text, true, false);
    EXPECT_EQ(ids_str(ids), ids_str(manifest));
    ASSERT_EQ(o.pieces.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(tok.token_to_piece(ids[i]), o.pieces[i]) << "token " << i;
    }
    // decoding with the BOS keeps the space the tokenizer put in front (formats.md §4.6)
    EXPECT_EQ(tok.decode(ids), "<s> " + text);
    EXPECT_EQ(tok.decode(ids, false, false), " " + text);
    EXPECT_EQ(tok.decode(ids, true, false), " " + text);
    // without the BOS the leading space goes
    EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), text);
}

TEST(TokenizerPrompts, Prompt2SyntheticQwen2) {
    for (const char * model : {"tiny-random-qwen2", "tiny-random-qwen3"}) {
        const rp::Tokenizer & tok = *load_cached(models_dir() + "/synthetic/" + model + ".gguf").tok;
        const std::string text = read_file(models_dir() + "/reference/prompt2.txt");
        const Oracle o = read_oracle(models_dir() + "/reference/" + model + ".prompt2.oracle.txt");
        const std::vector<int32_t> manifest = {267, 117, 115, 261, 258, 265, 101, 97, 116, 257, 114, 268};
        EXPECT_EQ(o.tokens, manifest) << model;
        EXPECT_FALSE(tok.add_bos()) << model;  // add_bos_token = false in the file
        const std::vector<int32_t> ids = tok.encode(text, true, true);
        EXPECT_EQ(ids_str(ids), ids_str(manifest)) << model;
        ASSERT_EQ(o.pieces.size(), ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
            EXPECT_EQ(tok.token_to_piece(ids[i]), o.pieces[i]) << model << " token " << i;
        }
        EXPECT_EQ(tok.decode(ids), text);
        EXPECT_TRUE(tok.is_eog(268));  // <|im_end|>
    }
}

TEST(TokenizerSpecial, IdsAndFlagsFromManifest) {
    struct Want {
        const char * name;
        int32_t n_vocab, bos, eos;
        bool add_bos;
        rp::TokenizerModel model;
    };
    const Want wants[] = {
        {"llama-spm", 32000, 1, 2, true, rp::TokenizerModel::Spm},
        {"llama-bpe", 128256, 128000, 128001, true, rp::TokenizerModel::Bpe},
        {"qwen2", 151936, 151643, 151643, false, rp::TokenizerModel::Bpe},
        {"gpt-2", 50257, 50256, 50256, false, rp::TokenizerModel::Bpe},
    };
    for (const Want & w : wants) {
        const rp::Tokenizer & tok = vocab(w.name);
        EXPECT_EQ(tok.n_vocab(), w.n_vocab) << w.name;
        EXPECT_EQ(tok.bos(), w.bos) << w.name;
        EXPECT_EQ(tok.eos(), w.eos) << w.name;
        EXPECT_EQ(tok.add_bos(), w.add_bos) << w.name;
        EXPECT_FALSE(tok.add_eos()) << w.name;
        EXPECT_EQ(tok.model(), w.model) << w.name;
        EXPECT_TRUE(tok.is_eog(w.eos)) << w.name;
    }
    EXPECT_EQ(vocab("llama-bpe").pre(), rp::PreTokenizer::Llama3);
    EXPECT_EQ(vocab("qwen2").pre(), rp::PreTokenizer::Qwen2);
    EXPECT_EQ(vocab("gpt-2").pre(), rp::PreTokenizer::Gpt2);
    // end of turn: Llama 3 <|eot_id|>, Qwen <|im_end|>
    EXPECT_EQ(vocab("llama-bpe").eot(), 128009);
    EXPECT_TRUE(vocab("llama-bpe").is_eog(128009));
    EXPECT_FALSE(vocab("llama-bpe").is_eog(128000));
    EXPECT_EQ(vocab("qwen2").eot(), 151645);
    EXPECT_TRUE(vocab("qwen2").is_eog(151645));
    EXPECT_FALSE(vocab("qwen2").is_eog(151644));
    EXPECT_FALSE(vocab("qwen2").is_eog(9707));
}

TEST(TokenizerSpecial, BosAdded) {
    EXPECT_EQ(vocab("llama-bpe").encode("Hello", true), (std::vector<int32_t>{128000, 9906}));
    EXPECT_EQ(vocab("llama-bpe").encode("Hello", false), (std::vector<int32_t>{9906}));
    EXPECT_EQ(vocab("qwen2").encode("Hello", true), (std::vector<int32_t>{9707}));  // Qwen adds no BOS
    EXPECT_EQ(vocab("llama-spm").encode("", true), (std::vector<int32_t>{1}));
    EXPECT_TRUE(vocab("llama-spm").encode("", false).empty());
    EXPECT_TRUE(vocab("qwen2").encode("", true).empty());
}

TEST(TokenizerSpecial, ControlTokensOnlyWithParseSpecial) {
    const rp::Tokenizer & q = vocab("qwen2");
    const std::string chat = "<|im_start|>user\nHi<|im_end|>";
    // ids read off the vocabulary: user 872, Ċ 198, Hi 13048
    EXPECT_EQ(q.encode(chat, false, true), (std::vector<int32_t>{151644, 872, 198, 13048, 151645}));
    const std::vector<int32_t> plain = q.encode(chat, false, false);
    for (int32_t id : plain) {
        EXPECT_LT(id, 151643) << "a special id although parse_special is off";
    }
    EXPECT_EQ(q.decode(plain), chat);
    EXPECT_EQ(plain.front(), 27);  // '<'
    // Llama 3 header
    const rp::Tokenizer & l = vocab("llama-bpe");
    EXPECT_EQ(l.encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", true, true),
              (std::vector<int32_t>{128000, 128006, 882, 128007, 271, 13347, 128009}));
}

TEST(TokenizerSpecial, UserDefinedTokensAlwaysMatch) {
    // Qwen's [PAD151646].. fillers are USER_DEFINED (type 4): matched even without parse_special.
    const rp::Tokenizer & q = vocab("qwen2");
    EXPECT_EQ(q.attr(151700), rp::kAttrUserDefined);
    EXPECT_EQ(q.encode("a[PAD151700]b", false, false), (std::vector<int32_t>{64, 151700, 65}));
    EXPECT_EQ(q.token_to_piece(151700, false), "[PAD151700]");
}

TEST(TokenizerSpecial, SpmSpacePrefixAfterSpecial) {
    const rp::Tokenizer & tok = *load_cached(models_dir() + "/stories260K.gguf").tok;
    // "<s>" is parsed as BOS; the raw text after it gets the ▁ prefix: "▁Once" = 403
    EXPECT_EQ(tok.encode("<s>Once", false, true), (std::vector<int32_t>{1, 403}));
    EXPECT_EQ(tok.encode("<s>Once", true, true), (std::vector<int32_t>{1, 1, 403}));
    // not parsed: "<s>" is text (its characters, after the ▁ prefix)
    const std::vector<int32_t> text = tok.encode("<s>Once", false, false);
    EXPECT_EQ(std::count(text.begin(), text.end(), 1), 0);
    EXPECT_EQ(tok.decode(text), "<s>Once");
}

TEST(TokenizerPieces, ControlPiecesNeedSpecial) {
    const rp::Tokenizer & q = vocab("qwen2");
    EXPECT_EQ(q.token_to_piece(151644, true), "<|im_start|>");
    EXPECT_EQ(q.token_to_piece(151644, false), "");
    EXPECT_EQ(q.token_to_piece(1879), " world");  // Ġworld
    const rp::Tokenizer & s = vocab("llama-spm");
    EXPECT_EQ(s.token_to_piece(1), "<s>");
    EXPECT_EQ(s.token_to_piece(13), "\n");  // <0x0A>
    EXPECT_THROW(s.token_to_piece(32000), rp::Error);
    EXPECT_THROW(s.token_to_piece(-1), rp::Error);
}

TEST(TokenizerBytes, MalformedUtf8) {
    // BPE: llama.cpp decodes to code points first, a malformed byte becoming U+FFFD (bytes EF BF BD).
    const rp::Tokenizer & q = vocab("qwen2");
    EXPECT_EQ(q.encode("\xff", false), (std::vector<int32_t>{5691}));  // ï¿½ = U+FFFD mapped
    EXPECT_EQ(q.decode(q.encode("a\xff" "b", false)), "a\xef\xbf\xbd" "b");
    // SPM works on bytes: <0xFF> after the ▁ prefix, and decoding restores the byte
    const rp::Tokenizer & s = *load_cached(models_dir() + "/stories260K.gguf").tok;
    EXPECT_EQ(s.encode("\xff", false), (std::vector<int32_t>{410, 258}));
    EXPECT_EQ(s.decode(s.encode("x\xff\xfe", false)), "x\xff\xfe");
}

TEST(TokenizerOffsets, BpeOffsetsAreCumulativePieceLengths) {
    for (const char * name : {"qwen2", "llama-bpe", "gpt-2"}) {
        const rp::Tokenizer & tok = vocab(name);
        for (const std::string & s : read_inp(models_dir() + "/vocab/ggml-vocab-" + std::string(name) + ".gguf.inp")) {
            std::vector<size_t> offs;
            const std::vector<int32_t> ids = tok.encode(s, false, false, &offs);
            ASSERT_EQ(offs.size(), ids.size());
            size_t at = 0;
            for (size_t i = 0; i < ids.size(); ++i) {
                EXPECT_EQ(offs[i], at) << name << " token " << i << " of '" << s << "'";
                at += tok.token_to_piece(ids[i]).size();
            }
            EXPECT_EQ(at, s.size());
        }
    }
}

TEST(TokenizerOffsets, SpmAndSpecial) {
    const rp::Tokenizer & tok = *load_cached(models_dir() + "/stories260K.gguf").tok;
    const std::string text = read_file(models_dir() + "/reference/prompt1.txt");
    std::vector<size_t> offs;
    tok.encode(text, true, false, &offs);
    // <s>, " Once" (the inserted space counts at 0), " upon" at the space before it, " a", " time", ","
    ASSERT_GE(offs.size(), 6u);
    EXPECT_EQ(std::vector<size_t>(offs.begin(), offs.begin() + 6), (std::vector<size_t>{0, 0, 4, 9, 11, 16}));
    const rp::Tokenizer & q = vocab("qwen2");
    q.encode("<|im_start|>user\nHi<|im_end|>", false, true, &offs);
    EXPECT_EQ(offs, (std::vector<size_t>{0, 12, 16, 17, 19}));
}

// ---- bad files -------------------------------------------------------------------------------------

std::string write_vocab(const std::string & name, const std::function<void(gguf::Writer &)> & edit) {
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|x|>"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3});
    w.set_string_array("tokenizer.ggml.merges", {"a b"});
    edit(w);
    const std::string path = ::testing::TempDir() + "/rp_tok_" + name + "." + std::to_string(getpid()) + ".gguf";
    w.write(path);
    return path;
}

void expect_error(const std::string & path, const std::vector<std::string> & parts) {
    try {
        rp::Tokenizer::load(path);
        ADD_FAILURE() << path << " loaded";
    } catch (const rp::Error & e) {
        for (const std::string & p : parts) {
            EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << e.what() << "' lacks '" << p << "'";
        }
    }
    std::remove(path.c_str());
}

TEST(TokenizerErrors, SmallValidFileWorks) {
    const std::string path = write_vocab("ok", [](gguf::Writer &) {});
    const auto tok = rp::Tokenizer::load(path);
    EXPECT_EQ(tok->encode("abab<|x|>", false, true), (std::vector<int32_t>{2, 2, 3}));
    EXPECT_EQ(tok->encode("ba", false, false), (std::vector<int32_t>{1, 0}));
    std::remove(path.c_str());
}

TEST(TokenizerErrors, UnknownModel) {
    expect_error(write_vocab("bert", [](gguf::Writer & w) { w.set_string("tokenizer.ggml.model", "bert"); }),
                 {"tokenizer.ggml.model", "'bert'", "rp_tok_bert."});
}

TEST(TokenizerErrors, UnknownPre) {
    expect_error(write_vocab("pre", [](gguf::Writer & w) { w.set_string("tokenizer.ggml.pre", "my-new-pre"); }),
                 {"tokenizer.ggml.pre", "'my-new-pre'"});
}

TEST(TokenizerErrors, MissingPieces) {
    expect_error(write_vocab("nomerges", [](gguf::Writer & w) { w.remove("tokenizer.ggml.merges"); }),
                 {"tokenizer.ggml.merges"});
    expect_error(write_vocab("notokens", [](gguf::Writer & w) { w.remove("tokenizer.ggml.tokens"); }),
                 {"tokenizer.ggml.tokens"});
    expect_error(write_vocab("nomodel", [](gguf::Writer & w) { w.remove("tokenizer.ggml.model"); }),
                 {"tokenizer.ggml.model"});
    expect_error(write_vocab("shorttypes", [](gguf::Writer & w) { w.set_i32_array("tokenizer.ggml.token_type", {1, 1}); }),
                 {"tokenizer.ggml.token_type"});
    expect_error(write_vocab("badtokens", [](gguf::Writer & w) { w.set_u32("tokenizer.ggml.tokens", 4); }),
                 {"tokenizer.ggml.tokens"});
}

TEST(TokenizerErrors, MissingPreIsDefault) {
    const std::string path = write_vocab("nopre", [](gguf::Writer & w) { w.remove("tokenizer.ggml.pre"); });
    const auto tok = rp::Tokenizer::load(path);
    EXPECT_EQ(tok->pre(), rp::PreTokenizer::Default);
    std::remove(path.c_str());
}

} // namespace
