// rp-gguf, run as a program: info / dump / convert / diff on stories260K, and clean failures (exit 1, a
// message naming the file, nothing on stdout, no output file).
#include "gguf/gguf.h"
#include "gguf_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

using namespace gguf_test;
using gguf::TensorType;

namespace {

std::string q(const std::string & s) { return "'" + s + "'"; }

// max |w| of an F32 tensor, read straight from the file bytes.
double f32_absmax(const gguf::Reader & r, const gguf::TensorInfo & t) {
    double m = 0;
    for (int64_t i = 0; i < t.nelements(); ++i) {
        float v;
        std::memcpy(&v, r.tensor_data(t) + 4 * i, 4);
        m = std::max(m, std::fabs(static_cast<double>(v)));
    }
    return m;
}

// Every tensor of `a` is in `b` with the same type and bytes.
void expect_same_tensors(const gguf::Reader & a, const gguf::Reader & b) {
    for (const auto & t : a.tensors()) {
        const auto * rt = b.find_tensor(t.name);
        ASSERT_NE(rt, nullptr) << t.name;
        EXPECT_EQ(t.type, rt->type) << t.name;
        ASSERT_EQ(t.nbytes, rt->nbytes) << t.name;
        EXPECT_EQ(std::memcmp(a.tensor_data(t), b.tensor_data(*rt), t.nbytes), 0) << t.name;
    }
}

} // namespace

TEST(GgufTool, InfoListsEveryTensor) {
    TempDir dir;
    const RunResult r = run_tool("info " + q(stories()), dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    const auto reader = gguf::Reader::open(stories());
    for (const auto & t : reader->tensors()) EXPECT_NE(r.out.find(" " + t.name + " "), std::string::npos) << t.name;
    EXPECT_NE(r.out.find("blk.4.ffn_norm.weight"), std::string::npos);
    EXPECT_NE(r.out.find("tensors: 48"), std::string::npos);
    EXPECT_NE(r.out.find("GGUF v3"), std::string::npos);
    EXPECT_NE(r.out.find("[string x 512] ['<unk>', '<s>', ...]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("llama.feed_forward_length"), std::string::npos);
    EXPECT_NE(r.out.find("48 tensors, 292800 parameters, 1171200 bytes"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[172, 64]"), std::string::npos);
}

TEST(GgufTool, FailuresExitOneWithTheFileName) {
    TempDir dir;
    const std::string missing = dir.file("missing.gguf");
    RunResult r = run_tool("info " + q(missing), dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(r.out.empty());
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;

    // A truncated copy of stories260K: cut inside the tensor data.
    auto bytes = read_bytes(stories());
    bytes.resize(bytes.size() / 2);
    const std::string cut = dir.file("cut.gguf");
    write_bytes(cut, bytes);
    r = run_tool("info " + q(cut), dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(r.out.empty()) << "partial output: " << r.out;
    EXPECT_NE(r.err.find(cut), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;

    r = run_tool("dump " + q(stories()) + " no.such.tensor", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("no.such.tensor"), std::string::npos) << r.err;
    r = run_tool("dump " + q(stories()) + " output.weight -n x", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("-n"), std::string::npos) << r.err;
    r = run_tool("convert " + q(stories()) + " " + q(dir.file("o.gguf")) + " --type q7_k", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--type"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("q4_k_m"), std::string::npos) << "the valid names are listed: " << r.err;
    EXPECT_FALSE(fs::exists(dir.file("o.gguf")));
    r = run_tool("convert " + q(stories()) + " " + q(dir.file("o.gguf")) + " --type q2_k_s", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("importance matrix"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("o.gguf")));
    r = run_tool("convert " + q(stories()) + " " + q(dir.file("o.gguf")), dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--type"), std::string::npos) << r.err;
    r = run_tool("convert " + q(cut) + " " + q(dir.file("o.gguf")) + " --type f16", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find(cut), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("o.gguf")));
    // synth: an unknown type names the flag and lists the mixes; a mix with data is refused (convert quantizes data)
    r = run_tool("synth " + q(dir.file("o.gguf")) + " --shape llama-20m --weights 0 --type q7_k", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--type: 'q7_k'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("q4_k_m"), std::string::npos) << r.err;
    r = run_tool("synth " + q(dir.file("o.gguf")) + " --shape llama-20m --type q4_k_m", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("rp-gguf convert --type q4_k_m"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("o.gguf")));
    r = run_tool("info " + q(stories()) + " --frobnicate", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--frobnicate"), std::string::npos) << r.err;
    r = run_tool("launch", dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("launch"), std::string::npos) << r.err;
    r = run_tool("", dir);
    EXPECT_EQ(r.code, 1);
}

TEST(GgufTool, HelpEverywhere) {
    TempDir dir;
    for (const char * args : {"--help", "-h", "info --help", "dump -h", "convert --help", "diff -h"}) {
        const RunResult r = run_tool(args, dir);
        EXPECT_EQ(r.code, 0) << args;
        EXPECT_NE(r.out.find("usage: rp-gguf"), std::string::npos) << args;
    }
}

TEST(GgufTool, DumpPrintsTheStoredValues) {
    TempDir dir;
    const RunResult r = run_tool("dump " + q(stories()) + " output_norm.weight -n 5", dir);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto reader = gguf::Reader::open(stories());
    const auto * t = reader->find_tensor("output_norm.weight");
    std::istringstream in(r.out);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line[0], '#');
    std::vector<float> got;
    while (std::getline(in, line)) got.push_back(std::strtof(line.c_str(), nullptr));
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
        float want;
        std::memcpy(&want, reader->tensor_data(*t) + 4 * i, 4);
        EXPECT_EQ(got[i], want) << i;   // printed with enough digits to read back exactly
    }
    const RunResult all = run_tool("dump " + q(stories()) + " output_norm.weight -n 0", dir);
    EXPECT_EQ(std::count(all.out.begin(), all.out.end(), '\n'), 65);
}

TEST(GgufTool, ConvertToQ8_0ThenDiff) {
    TempDir dir;
    const std::string out = dir.file("q8.gguf");
    RunResult r = run_tool("convert " + q(stories()) + " " + q(out) + " --type q8_0", dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("blk.0.ffn_down.weight"), std::string::npos) << "the f16 fallback is reported: " << r.out;

    // The output loads, with llama-quantize's type layout (MANIFEST: 32 Q8_0, 5 F16 ffn_down, 11 F32).
    const auto orig = gguf::Reader::open(stories());
    const auto conv = gguf::Reader::open(out);
    ASSERT_EQ(conv->tensors().size(), 48u);
    EXPECT_EQ(conv->get_u32("general.file_type"), 7u);
    EXPECT_EQ(conv->get_u32("general.quantization_version"), 2u);
    EXPECT_EQ(conv->get_u32("llama.block_count"), 5u);
    std::map<TensorType, int> counts;
    for (const auto & t : conv->tensors()) counts[t.type]++;
    EXPECT_EQ(counts, (std::map<TensorType, int>{{TensorType::Q8_0, 32}, {TensorType::F16, 5}, {TensorType::F32, 11}}));

    // Independent reference: llama-quantize's own Q8_0 file has the same tensor bytes (ggml's reference
    // Q8_0 quantizer and f32 -> f16 rounding are deterministic).
    const auto ref = gguf::Reader::open(models_dir() + "/derived/stories260K-Q8_0.gguf");
    expect_same_tensors(*conv, *ref);

    // diff: every tensor compared, differences within the quantization error bounds.
    r = run_tool("diff " + q(stories()) + " " + q(out), dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("48 tensors compared"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("0 only in A, 0 only in B, 0 shape mismatches"), std::string::npos) << r.out;
    std::istringstream in(r.out);
    std::string line;
    int rows = 0;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        std::string name, ta, tb, d;
        ls >> name >> ta >> tb >> d;
        const auto * t = orig->find_tensor(name);
        if (!t) continue;
        ++rows;
        const double diff = std::strtod(d.c_str(), nullptr);
        const double amax = f32_absmax(*orig, *t);
        if (tb == "q8_0") {
            // |x - d'q| <= d/2 + |d - d'|*127 with d = amax_block/127 and d' = d rounded to f16
            // (relative error <= 2^-11): at most amax/254 + amax*2^-11.
            EXPECT_LE(diff, amax * (1.0 / 254 + std::ldexp(1.0, -11))) << line;
            EXPECT_GT(diff, 0) << line;
        } else if (tb == "f16") {
            // f32 -> f16 round to nearest: relative error <= 2^-11, absolute <= 2^-25 for subnormals.
            EXPECT_LE(diff, amax * std::ldexp(1.0, -11) + std::ldexp(1.0, -25)) << line;
        } else {
            EXPECT_EQ(tb, "f32") << line;
            EXPECT_EQ(diff, 0) << line;
        }
    }
    EXPECT_EQ(rows, 48);
}

TEST(GgufTool, ConvertToEveryTypeLoadsAndDiffReportsMissingTensors) {
    TempDir dir;
    for (const char * type : {"f32", "f16", "bf16", "q4_0"}) {
        SCOPED_TRACE(type);
        const std::string out = dir.file(std::string(type) + ".gguf");
        const RunResult r = run_tool("convert " + q(stories()) + " " + q(out) + " --type " + type, dir);
        ASSERT_EQ(r.code, 0) << r.err;
        const auto conv = gguf::Reader::open(out);
        EXPECT_EQ(conv->tensors().size(), 48u);
        for (const auto & t : conv->tensors()) {
            if (t.n_dims == 1) {
                EXPECT_EQ(t.type, TensorType::F32) << t.name;
            }
        }
        if (std::string(type) == "f32") {
            const auto orig = gguf::Reader::open(stories());
            for (const auto & t : conv->tensors()) {
                const auto * o = orig->find_tensor(t.name);
                ASSERT_TRUE(o && t.type == TensorType::F32 && t.nbytes == o->nbytes) << t.name;
                EXPECT_EQ(std::memcmp(conv->tensor_data(t), orig->tensor_data(*o), t.nbytes), 0) << t.name;
            }
        }
        if (std::string(type) == "q4_0") {
            // llama-quantize's rule: the head gets Q6_K, and its rows of 64 fall back to Q8_0; the ffn_down
            // rows of 172 to F16. Its own file (MANIFEST: derived/) has the same types and bytes.
            EXPECT_EQ(conv->find_tensor("output.weight")->type, TensorType::Q8_0);
            const auto ref = gguf::Reader::open(models_dir() + "/derived/stories260K-Q4_0.gguf");
            expect_same_tensors(*conv, *ref);
        }
    }
    // Against a model with other tensors: missing, extra and reshaped tensors are listed, exit status 0.
    const RunResult r = run_tool("diff " + q(stories()) + " " + q(models_dir() + "/synthetic/tiny-random-qwen3.gguf"), dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("only in A: output.weight"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("only in B: blk.0.attn_q_norm.weight"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("shape mismatch: blk.0.ffn_gate.weight [64, 172] vs [64, 96]"), std::string::npos) << r.out;
}
