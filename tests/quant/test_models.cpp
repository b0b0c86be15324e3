// The derived stories260K files made by llama.cpp's llama-quantize (shared/models/derived), checked against
// the F32 original: every tensor dequantizes to within its format's bound, and re-quantizing the F32 weights
// with our Q8_0 / Q4_0 quantizers reproduces llama-quantize's bytes.
#include "ggml_rp/core/quant.h"
#include "gguf/gguf.h"
#include "quant_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using gguf::TensorType;

std::string shared_dir() {
    if (const char * env = std::getenv("RP_SHARED_DIR")) return env;
    return RP_SHARED_DIR;
}

std::string model(const std::string & name) { return shared_dir() + "/models/" + name; }

std::vector<float> f32_of(const gguf::Reader & r, const gguf::TensorInfo & t) {
    std::vector<float> v(static_cast<size_t>(t.nelements()));
    std::memcpy(v.data(), r.tensor_data(t), v.size() * sizeof(float));
    return v;
}

// Largest violation ratio |err| / bound over a block-quantized tensor (32-element blocks of x), with the bound
// of a round-to-nearest code with scale d (plus the f16 rounding of d, at most 2^-11 relative, times the
// largest code magnitude `qmax`). `scale` gives d from the block's values.
template <class Scale>
double block_bound_ratio(const std::vector<float> & x, const std::vector<float> & y, double step, int qmax,
                         Scale scale) {
    double worst = 0;
    for (size_t b = 0; b < x.size() / 32; ++b) {
        const double d = std::fabs(scale(&x[32 * b]));
        const double bound = d * (step + 1e-4) + qmax * d * std::ldexp(1.0, -11) + 1e-12;
        for (size_t j = 32 * b; j < 32 * b + 32; ++j) worst = std::max(worst, std::fabs(x[j] - y[j]) / bound);
    }
    return worst;
}

double amax_over(const float * x, double div) {
    double a = 0;
    for (int j = 0; j < 32; ++j) a = std::max(a, static_cast<double>(std::fabs(x[j])));
    return a / div;
}

struct Counts {
    int tensors = 0, by_type[64] = {};
};

// Dequantizes every tensor of `file` and checks it against the F32 model within the bound of its type.
Counts check_file(const std::string & file) {
    const auto ref = gguf::Reader::open(model("stories260K.gguf"));
    const auto q = gguf::Reader::open(model(file));
    Counts c;
    EXPECT_EQ(q->tensors().size(), ref->tensors().size());
    for (const gguf::TensorInfo & t : q->tensors()) {
        SCOPED_TRACE(t.name);
        const gguf::TensorInfo * rt = ref->find_tensor(t.name);
        if (!rt) { ADD_FAILURE() << "not in the F32 model"; continue; }
        EXPECT_EQ(rt->type, TensorType::F32);
        EXPECT_EQ(t.nelements(), rt->nelements());
        const std::vector<float> x = f32_of(*ref, *rt);
        std::vector<float> y(x.size());
        rp::dequantize_row(t.type, q->tensor_data(t), y.data(), t.nelements());
        ++c.tensors;
        ++c.by_type[static_cast<uint32_t>(t.type) & 63];
        double worst = 0;
        switch (t.type) {
        case TensorType::F32:
            EXPECT_EQ(y, x);
            break;
        case TensorType::F16:  // round to nearest: relative 2^-11 (2^-25 absolute in the subnormal range)
            for (size_t i = 0; i < x.size(); ++i)
                worst = std::max(worst, std::fabs(x[i] - y[i]) /
                                            std::max(std::fabs(x[i]) * std::ldexp(1.0, -11), std::ldexp(1.0, -25)));
            break;
        case TensorType::BF16:  // relative 2^-8
            for (size_t i = 0; i < x.size(); ++i)
                worst = std::max(worst, std::fabs(x[i] - y[i]) / (std::fabs(x[i]) * std::ldexp(1.0, -8) + 1e-30));
            break;
        case TensorType::Q8_0:  // d = amax/127, error <= d/2
            worst = block_bound_ratio(x, y, 0.5, 127, [](const float * b) { return amax_over(b, 127); });
            break;
        case TensorType::Q4_0:  // d = max/-8 (signed); s = x/d is rounded to nearest, but s > 7.5 is clamped to 7
            for (size_t b = 0; b < x.size() / 32; ++b) {
                double mx = 0;
                for (size_t j = 32 * b; j < 32 * b + 32; ++j)
                    if (std::fabs(x[j]) > std::fabs(mx)) mx = x[j];
                const double d = mx / -8;
                for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
                    const double step = std::max(0.5, x[j] / d - 7);
                    const double bound = std::fabs(d) * (step + 1e-4) + 8 * std::fabs(d) * std::ldexp(1.0, -11) + 1e-12;
                    worst = std::max(worst, std::fabs(x[j] - y[j]) / bound);
                }
            }
            break;
        default:
            ADD_FAILURE() << "unexpected type " << gguf::type_name(static_cast<uint32_t>(t.type));
        }
        EXPECT_LE(worst, 1.0) << gguf::type_name(static_cast<uint32_t>(t.type));
    }
    return c;
}

// Re-encodes the F32 weights of every non-F32 tensor of `file` (Q8_0, Q4_0, F16, BF16) with our quantize_row;
// returns {tensors with identical bytes, tensors compared}.
std::pair<int, int> requantize_matches(const std::string & file) {
    const auto ref = gguf::Reader::open(model("stories260K.gguf"));
    const auto q = gguf::Reader::open(model(file));
    int match = 0, total = 0;
    for (const gguf::TensorInfo & t : q->tensors()) {
        if (t.type == TensorType::F32) continue;
        const gguf::TensorInfo * rt = ref->find_tensor(t.name);
        if (!rt) { ADD_FAILURE() << t.name << " not in the F32 model"; continue; }
        const std::vector<float> x = f32_of(*ref, *rt);
        std::vector<uint8_t> mine(t.nbytes);
        rp::quantize_row(t.type, x.data(), mine.data(), t.nelements());
        ++total;
        const bool same = std::memcmp(mine.data(), q->tensor_data(t), t.nbytes) == 0;
        match += same;
        EXPECT_TRUE(same) << t.name << " (" << gguf::type_name(static_cast<uint32_t>(t.type)) << ")";
    }
    return {match, total};
}

} // namespace

TEST(DerivedModels, F16) {
    const Counts c = check_file("derived/stories260K-F16.gguf");
    EXPECT_EQ(c.by_type[1], 37);
    EXPECT_EQ(c.by_type[0], 11);
}

TEST(DerivedModels, BF16) {
    const Counts c = check_file("derived/stories260K-BF16.gguf");
    EXPECT_EQ(c.by_type[30], 37);
    EXPECT_EQ(c.by_type[0], 11);
}

TEST(DerivedModels, Q8_0) {
    const Counts c = check_file("derived/stories260K-Q8_0.gguf");
    EXPECT_EQ(c.by_type[8], 32);
    EXPECT_EQ(c.by_type[1], 5);
}

TEST(DerivedModels, Q4_0) {
    const Counts c = check_file("derived/stories260K-Q4_0.gguf");
    EXPECT_EQ(c.by_type[2], 31);
    EXPECT_EQ(c.by_type[8], 1);
    EXPECT_EQ(c.by_type[1], 5);
}

TEST(DerivedModels, RequantizeMatchesLlamaQuantizeBytes) {
    for (const char * f : {"F16", "BF16", "Q8_0", "Q4_0"}) {
        const auto [match, total] = requantize_matches(std::string("derived/stories260K-") + f + ".gguf");
        std::printf("stories260K-%s: %d/%d re-encoded tensors byte-identical to llama-quantize\n", f, match, total);
        EXPECT_EQ(total, 37) << f;
        RecordProperty(std::string(f) + "_identical", match);
    }
}
