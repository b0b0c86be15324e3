// CUDA mul_mat family (cuBLAS), LoRA, flash attention and the fused LM head + cross-entropy against the CPU
// kernels (ggml_rp/cpu/gemm.h, attention.h, cross_entropy.h) on the same random inputs; LoRA against a
// double-precision loop of its formula. Skipped without a CUDA device.
#include "cuda_test_util.h"

#if defined(RP_HAVE_CUDA)

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cuda/attention.cuh"
#include "ggml_rp/cuda/blas.cuh"
#include "ggml_rp/cuda/cross_entropy.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"

#include <cmath>
#include <cstring>
#include <memory>

using cutest::Dev;
using cutest::kNmseF32;
using cutest::kNmseHalf;
using cutest::nmse;
using cutest::rand_vec;
using gguf::TensorType;

namespace {

std::vector<uint8_t> quantized(TensorType t, const std::vector<float> & v, int64_t K, int64_t N) {
    std::vector<uint8_t> bytes(gguf::row_bytes(t, K) * size_t(N));
    for (int64_t r = 0; r < N; ++r) rp::quantize_row(t, v.data() + r * K, bytes.data() + gguf::row_bytes(t, K) * size_t(r), K);
    return bytes;
}

// Values rounded to the half type and back (the inputs the GPU sees), and their 16-bit patterns.
std::vector<float> rounded(TensorType t, const std::vector<float> & v, std::vector<uint16_t> * bits) {
    std::vector<float> r(v.size());
    if (bits) bits->resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t b = t == TensorType::F16 ? rp::fp32_to_fp16(v[i]) : rp::fp32_to_bf16(v[i]);
        r[i] = t == TensorType::F16 ? rp::fp16_to_fp32(b) : rp::bf16_to_fp32(b);
        if (bits) (*bits)[i] = b;
    }
    return r;
}

} // namespace

TEST(CudaMatmul, EveryWeightTypeForwardAndBackwardX) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(11);
    // The types the reference quantizer writes (the K-quants share the dequantize-then-GEMM path).
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                         TensorType::Q4_1, TensorType::Q5_0}) {
        const bool block = gguf::type_traits(uint32_t(t))->block_size > 1;
        const int64_t K = block ? 96 : 67, N = 45, T = 13;
        SCOPED_TRACE(std::string(gguf::type_name(uint32_t(t))) + " K=" + std::to_string(K));
        const auto w = quantized(t, rand_vec(size_t(K * N), rng), K, N);
        const size_t rb = gguf::row_bytes(t, K);
        const auto x = rand_vec(size_t(K * T), rng), dy = rand_vec(size_t(N * T), rng);
        const auto y0 = rand_vec(size_t(N * T), rng), dx0 = rand_vec(size_t(K * T), rng);
        for (bool acc : {false, true}) {
            std::vector<float> y = y0, dx = dx0;
            rp::cpu::matmul_fwd(K, N, T, w.data(), t, rb, x.data(), K, y.data(), N, acc);
            rp::cpu::matmul_bwd_x(K, N, T, w.data(), t, rb, dy.data(), N, dx.data(), K, acc);
            Dev<uint8_t> dw(w), ws(rp::cuda::matmul_workspace_bytes(K, N, T, t));
            Dev<float> dxin(x), ddy(dy), gy(y0), gdx(dx0);
            rp::cuda::matmul_fwd(K, N, T, dw.p, t, rb, dxin.p, K, gy.p, N, acc, ws.p, ws.n, nullptr);
            rp::cuda::matmul_bwd_x(K, N, T, dw.p, t, rb, ddy.p, N, gdx.p, K, acc, ws.p, ws.n, nullptr);
            const double tol = (t == TensorType::F16 || t == TensorType::BF16) ? kNmseHalf : kNmseF32;
            EXPECT_LT(nmse(gy.get(), y), tol) << "accumulate=" << acc;
            EXPECT_LT(nmse(gdx.get(), dx), tol) << "accumulate=" << acc;
        }
    }
}

TEST(CudaMatmul, WeightGradientAccumulates) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(12);
    const int64_t K = 131, N = 77, T = 29, dw_row = 140;   // a padded row stride
    const auto x = rand_vec(size_t(K * T), rng), dy = rand_vec(size_t(N * T), rng);
    const auto dw0 = rand_vec(size_t(dw_row * N), rng);
    for (bool acc : {false, true}) {
        std::vector<float> ref = dw0;
        rp::cpu::matmul_bwd_w(K, N, T, x.data(), K, dy.data(), N, ref.data(), dw_row, acc);
        Dev<float> dx(x), ddy(dy), g(dw0);
        rp::cuda::matmul_bwd_w(K, N, T, dx.p, K, ddy.p, N, g.p, dw_row, acc, nullptr);
        EXPECT_LT(nmse(g.get(), ref), kNmseF32) << "accumulate=" << acc;
    }
}

// A stream whose handle is set to TF32 (what a CUDA device made with tf32_gemm gives its compute stream): the
// f32 GEMMs run on tensor cores -- within TF32's precision of the fp32 result, and measurably not fp32 --
// and the same bits on a second run; the default handle stays plain fp32.
TEST(CudaMatmul, Tf32StreamsRunF32GemmsOnTensorCores) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(13);
    const int64_t K = 256, N = 192, T = 1024;
    const auto x = rand_vec(size_t(K * T), rng), dy = rand_vec(size_t(N * T), rng);
    std::vector<float> ref(size_t(K * N), 0.0f);
    rp::cpu::matmul_bwd_w(K, N, T, x.data(), K, dy.data(), N, ref.data(), K, false);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    Dev<float> dx(x), ddy(dy), g32(size_t(K * N)), gtf(size_t(K * N)), gtf2(size_t(K * N));
    rp::cuda::matmul_bwd_w(K, N, T, dx.p, K, ddy.p, N, g32.p, K, false, s);
    rp::cuda::blas_set_tf32(s, true, "test");
    rp::cuda::matmul_bwd_w(K, N, T, dx.p, K, ddy.p, N, gtf.p, K, false, s);
    rp::cuda::matmul_bwd_w(K, N, T, dx.p, K, ddy.p, N, gtf2.p, K, false, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const double e32 = nmse(g32.get(), ref), etf = nmse(gtf.get(), ref);
    EXPECT_LT(e32, kNmseF32);
    EXPECT_LT(etf, 1e-5);
    EXPECT_GT(etf, 100 * e32) << "the TF32 handle computed in fp32";
    const auto a = gtf.get(), b = gtf2.get();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    rp::cuda::blas_release(s);
    cudaStreamDestroy(s);
}

TEST(CudaMatmul, LoraLinearMatchesItsFormula) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(13);
    const int64_t K = 40, N = 24, r = 4, T = 9;
    const float s = 0.75f;
    const auto W = rand_vec(size_t(K * N), rng), A = rand_vec(size_t(K * r), rng), B = rand_vec(size_t(r * N), rng);
    const auto x = rand_vec(size_t(K * T), rng), dy = rand_vec(size_t(N * T), rng);
    // Double reference: ax = A x, y = W x + s B ax; dax = s B dy; dx = W dy + A dax; dA = x dax^T; dB = s ax dy^T.
    std::vector<double> ax(size_t(r * T)), dax(size_t(r * T));
    std::vector<float> y(size_t(N * T)), dx(size_t(K * T)), dA(size_t(K * r)), dB(size_t(r * N));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < r; ++j) {
            double a = 0, d = 0;
            for (int64_t k = 0; k < K; ++k) a += double(A[size_t(j * K + k)]) * x[size_t(t * K + k)];
            for (int64_t n = 0; n < N; ++n) d += double(B[size_t(n * r + j)]) * dy[size_t(t * N + n)];
            ax[size_t(t * r + j)] = a;
            dax[size_t(t * r + j)] = s * d;
        }
        for (int64_t n = 0; n < N; ++n) {
            double v = 0;
            for (int64_t k = 0; k < K; ++k) v += double(W[size_t(n * K + k)]) * x[size_t(t * K + k)];
            for (int64_t j = 0; j < r; ++j) v += s * double(B[size_t(n * r + j)]) * ax[size_t(t * r + j)];
            y[size_t(t * N + n)] = float(v);
        }
        for (int64_t k = 0; k < K; ++k) {
            double v = 0;
            for (int64_t n = 0; n < N; ++n) v += double(W[size_t(n * K + k)]) * dy[size_t(t * N + n)];
            for (int64_t j = 0; j < r; ++j) v += double(A[size_t(j * K + k)]) * dax[size_t(t * r + j)];
            dx[size_t(t * K + k)] = float(v);
        }
    }
    for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < K; ++k) {
            double v = 0;
            for (int64_t t = 0; t < T; ++t) v += double(x[size_t(t * K + k)]) * dax[size_t(t * r + j)];
            dA[size_t(j * K + k)] = float(v);
        }
    for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < r; ++j) {
            double v = 0;
            for (int64_t t = 0; t < T; ++t) v += s * ax[size_t(t * r + j)] * dy[size_t(t * N + n)];
            dB[size_t(n * r + j)] = float(v);
        }
    Dev<float> dW(W), dA_(A), dB_(B), dxin(x), ddy(dy), gy(y.size()), gax(size_t(r * T)), gdx(dx.size()),
        gdA(dA.size()), gdB(dB.size()), gdax(size_t(r * T));
    rp::cuda::lora_linear_fwd(K, N, T, r, dW.p, TensorType::F32, size_t(K) * 4, dA_.p, dB_.p, s, dxin.p, gy.p, gax.p,
                              nullptr, 0, nullptr);
    rp::cuda::lora_linear_bwd(K, N, T, r, dW.p, TensorType::F32, size_t(K) * 4, dA_.p, dB_.p, s, dxin.p, gax.p, ddy.p,
                              gdx.p, gdA.p, gdB.p, gdax.p, nullptr, 0, nullptr);
    EXPECT_LT(nmse(gy.get(), y), kNmseF32);
    EXPECT_LT(nmse(gdx.get(), dx), kNmseF32);
    EXPECT_LT(nmse(gdA.get(), dA), kNmseF32);   // dA, dB started at zero: accumulation adds to 0
    EXPECT_LT(nmse(gdB.get(), dB), kNmseF32);
}

namespace {

struct AttnCase {
    int64_t D, Hq, Hkv, Tq, Tk, B;
    std::vector<int> docs = {};  // packed: document lengths, repeated over each sequence (key_start)
    int64_t window = 0;          // sliding window (0: none)
    bool sinks = false;          // one sink logit per query head
    float softcap = 0.0f;        // Gemma 2's logit soft-capping (0: none)
};

// Runs forward and backward on CPU (inputs as the GPU sees them) and GPU; checks o, lse, dq, dk, dv, and
// that a second GPU backward gives the same bits.
void check_attention(const AttnCase & c, TensorType type, std::mt19937 & rng) {
    SCOPED_TRACE(std::string(gguf::type_name(uint32_t(type))) + " D=" + std::to_string(c.D) + " Hq=" +
                 std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " Tq=" + std::to_string(c.Tq) + " Tk=" +
                 std::to_string(c.Tk) + " B=" + std::to_string(c.B) + " window=" + std::to_string(c.window) +
                 (c.sinks ? " sinks" : "") + " softcap=" + std::to_string(c.softcap));
    const size_t nq = size_t(c.D * c.Hq * c.Tq * c.B), nk = size_t(c.D * c.Hkv * c.Tk * c.B);
    std::vector<float> q = rand_vec(nq, rng), k = rand_vec(nk, rng), v = rand_vec(nk, rng), dout = rand_vec(nq, rng);
    std::vector<uint16_t> qb, kb, vb, db;
    const bool half = type != TensorType::F32;
    if (half) {
        q = rounded(type, q, &qb);
        k = rounded(type, k, &kb);
        v = rounded(type, v, &vb);
        dout = rounded(type, dout, &db);
    }
    const float scale = 1.0f / std::sqrt(float(c.D));
    rp::cpu::AttentionShape cs{c.D, c.Hq, c.Hkv, c.Tq, c.Tk, c.B, scale, c.window, c.softcap};
    const std::vector<float> sinks = c.sinks ? rand_vec(size_t(c.Hq), rng, -2.0f, 4.0f) : std::vector<float>();
    const float * csk = c.sinks ? sinks.data() : nullptr;
    std::vector<float> dsinks(size_t(c.Hq));
    std::vector<int32_t> ks;  // the first key of each query: its document's start (cycling through c.docs)
    if (!c.docs.empty())
        for (int64_t b = 0; b < c.B; ++b)
            for (int64_t t = 0, start = 0, d = 0, left = c.docs[0]; t < c.Tq; ++t, --left) {
                if (left == 0) {
                    start = t;
                    d = (d + 1) % int64_t(c.docs.size());
                    left = c.docs[size_t(d)];
                }
                ks.push_back(int32_t(start + c.Tk - c.Tq));
            }
    const int32_t * cks = ks.empty() ? nullptr : ks.data();
    std::vector<float> o(nq), lse(size_t(c.Hq * c.Tq * c.B)), dq(nq), dk(nk), dv(nk);
    rp::cpu::attention_fwd(cs, q.data(), k.data(), v.data(), o.data(), lse.data(), cks, csk);
    rp::cpu::attention_bwd(cs, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                           dv.data(), cks, csk, dsinks.data());

    auto upload = [&](const std::vector<float> & f, const std::vector<uint16_t> & b) {
        auto d = std::make_unique<Dev<uint8_t>>(half ? b.size() * 2 : f.size() * 4);
        EXPECT_EQ(cudaMemcpy(d->p, half ? static_cast<const void *>(b.data()) : static_cast<const void *>(f.data()), d->n,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
        return d;
    };
    auto gq = upload(q, qb), gk = upload(k, kb), gv = upload(v, vb), gdo = upload(dout, db);
    Dev<float> go(nq), glse(lse.size()), gdq(nq), gdk(nk), gdv(nk);
    Dev<uint8_t> ws(rp::cuda::attention_bwd_workspace_bytes(c.Hq, c.Tq, c.B));
    std::unique_ptr<Dev<int32_t>> gks;
    if (!ks.empty()) {
        gks = std::make_unique<Dev<int32_t>>(ks.size());
        EXPECT_EQ(cudaMemcpy(gks->p, ks.data(), ks.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    const int32_t * dks = gks ? gks->p : nullptr;
    Dev<float> gsinks(c.sinks ? sinks : std::vector<float>(1)), gdsinks(size_t(c.Hq));
    const float * dsk = c.sinks ? gsinks.p : nullptr;
    float * ddsk = c.sinks ? gdsinks.p : nullptr;
    rp::cuda::AttentionShape s{c.D, c.Hq, c.Hkv, c.Tq, c.Tk, c.B, scale, c.window, c.softcap};
    rp::cuda::attention_fwd(s, type, gq->p, gk->p, gv->p, go.p, glse.p, nullptr, dks, dsk);
    rp::cuda::attention_bwd(s, type, gq->p, gk->p, gv->p, go.p, glse.p, gdo->p, gdq.p, gdk.p, gdv.p, ws.p, ws.n, nullptr, dks,
                            nullptr, dsk, ddsk);
    const double tol = half ? kNmseHalf : kNmseF32;
    EXPECT_LT(nmse(go.get(), o), tol) << "o";
    EXPECT_LT(nmse(glse.get(), lse), tol) << "lse";
    EXPECT_LT(nmse(gdq.get(), dq), tol) << "dq";
    EXPECT_LT(nmse(gdk.get(), dk), tol) << "dk";
    EXPECT_LT(nmse(gdv.get(), dv), tol) << "dv";
    if (c.sinks) {
        EXPECT_LT(nmse(gdsinks.get(), dsinks), tol) << "dsinks";
    }
    const auto dk1 = gdk.get(), dv1 = gdv.get(), dq1 = gdq.get();
    rp::cuda::attention_bwd(s, type, gq->p, gk->p, gv->p, go.p, glse.p, gdo->p, gdq.p, gdk.p, gdv.p, ws.p, ws.n, nullptr, dks,
                            nullptr, dsk, ddsk);
    EXPECT_EQ(std::memcmp(dk1.data(), gdk.get().data(), nk * 4), 0) << "dk is not deterministic";
    EXPECT_EQ(std::memcmp(dv1.data(), gdv.get().data(), nk * 4), 0) << "dv is not deterministic";
    EXPECT_EQ(std::memcmp(dq1.data(), gdq.get().data(), nq * 4), 0) << "dq is not deterministic";
}

} // namespace

TEST(CudaAttention, OddShapesEveryInputType) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(21);
    const AttnCase cases[] = {
        {64, 4, 2, 37, 37, 2},    // GQA, a partial tile
        {7, 3, 1, 20, 50, 1},     // tiny head dim (padded to 16), KV-cache offset
        {256, 2, 2, 70, 70, 1},   // the largest head dim
        {128, 8, 8, 1, 1, 1},     // one token
        {80, 6, 2, 129, 129, 3},  // Qwen-like head dim 80, tile + 1
    };
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
        for (const AttnCase & c : cases) check_attention(c, t, rng);
}

// Packed sequences (document masking): the CUDA kernels against the CPU reference with key_start, documents
// crossing tiles, one-token documents, a KV-cache offset.
TEST(CudaAttention, PackedDocumentMasking) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(23);
    const AttnCase cases[] = {
        {64, 4, 2, 300, 300, 2, {5, 140, 1, 90, 64}},
        {80, 6, 2, 129, 129, 1, {1}},
        {16, 2, 1, 40, 50, 1, {7, 33}},
        {128, 8, 8, 1024, 1024, 1, {37, 400, 3, 511, 73}},
    };
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
        for (const AttnCase & c : cases) check_attention(c, t, rng);
}

// gpt-oss's attention (ops/attention.h): sliding windows smaller and larger than a tile, with a KV-cache
// offset and with packed documents, and per-head sink logits with their gradient.
TEST(CudaAttention, SlidingWindowAndSinks) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(24);
    const AttnCase cases[] = {
        {64, 4, 2, 300, 300, 2, {}, 128, true},      // gpt-oss's head dim, a window over several tiles
        {64, 8, 2, 77, 77, 1, {}, 5, false},         // a window inside one tile
        {16, 2, 1, 40, 90, 1, {}, 17, true},         // a KV-cache offset
        {80, 6, 2, 129, 129, 1, {7, 100, 22}, 30, true},  // with packed documents
        {128, 8, 8, 1, 1, 1, {}, 0, true},           // sinks alone, one token
    };
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
        for (const AttnCase & c : cases) check_attention(c, t, rng);
}

// Gemma 2's logit soft-capping (ops/attention.h): its own cap of 50, and a cap of 1 that bends most logits, with a
// window over tiles (Gemma 2's local layers), a KV-cache offset and packed documents.
TEST(CudaAttention, LogitSoftCapping) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(25);
    const AttnCase cases[] = {
        {128, 8, 4, 300, 300, 2, {}, 0, false, 50.0f},     // Gemma 2's head dim and cap
        {64, 4, 2, 200, 200, 1, {}, 96, false, 1.0f},      // a window over tiles
        {16, 2, 1, 40, 90, 1, {}, 0, false, 1.0f},         // a KV-cache offset
        {80, 6, 2, 129, 129, 1, {7, 100, 22}, 0, false, 2.0f},  // packed documents
    };
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
        for (const AttnCase & c : cases) check_attention(c, t, rng);
}

TEST(CudaAttention, LongSequence8192) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(22);
    check_attention({64, 2, 1, 8192, 8192, 1}, TensorType::BF16, rng);
}

namespace {

// A head problem: W [C, V] of type wt (rows of rb bytes), h [C, T], labels (every fifth from the fourth masked).
struct CeProblem {
    std::vector<uint8_t> w;
    size_t rb;
    std::vector<float> h;
    std::vector<int32_t> labels;
};
CeProblem make_ce_problem(int64_t C, int64_t V, int64_t T, TensorType wt, std::mt19937 & rng) {
    CeProblem p;
    p.w = quantized(wt, rand_vec(size_t(C * V), rng, -0.2f, 0.2f), C, V);
    p.rb = gguf::row_bytes(wt, C);
    p.h = rand_vec(size_t(C * T), rng);
    p.labels.resize(static_cast<size_t>(T));
    for (size_t t = 0; t < p.labels.size(); ++t) p.labels[t] = t % 5 == 3 ? -1 : int32_t(rng() % V);
    return p;
}

// loss_scale < 0: 1/T. zero_dw: dW starts at 0 (else random), so that tiny gradients are not lost in the sum.
void check_ce(int64_t C, int64_t V, int64_t T, TensorType wt, double tol, std::mt19937 & rng, float scale = -1.0f,
              bool zero_dw = false, float softcap = 0.0f) {
    SCOPED_TRACE(std::string(gguf::type_name(uint32_t(wt))) + " V=" + std::to_string(V) + " softcap=" + std::to_string(softcap));
    const CeProblem pr = make_ce_problem(C, V, T, wt, rng);
    const std::vector<uint8_t> & w = pr.w;
    const size_t rb = pr.rb;
    const std::vector<float> & h = pr.h;
    const std::vector<int32_t> & labels = pr.labels;
    const float loss_scale = scale > 0 ? scale : 1.0f / float(T);
    std::vector<float> dh(size_t(C * T)), dW = zero_dw ? std::vector<float>(size_t(C * V), 0.0f) : rand_vec(size_t(C * V), rng);
    const std::vector<float> dW0 = dW;
    const double loss = rp::cpu::lm_head_ce({C, V, T, 8192, softcap}, h.data(), w.data(), wt, rb, labels.data(), loss_scale,
                                            dh.data(), dW.data(), C);
    const int64_t chunk = rp::cuda::ce_chunk_rows(V, T, size_t(4) << 20);
    Dev<uint8_t> gw(w), ws(rp::cuda::lm_head_ce_workspace_bytes(C, V, T, chunk, wt));
    Dev<float> gh(h), gdh(dh.size()), gdW(dW0);
    Dev<int32_t> gl(labels);
    Dev<double> gloss(1);
    Dev<int> bad(1);
    rp::cuda::lm_head_ce({C, V, T, chunk, softcap}, gh.p, gw.p, wt, rb, gl.p, loss_scale, gloss.p, gdh.p, gdW.p, C, ws.p, ws.n,
                         bad.p, nullptr);
    const double gpu_loss = gloss.get()[0];
    EXPECT_LT(std::fabs(gpu_loss - loss) / std::fabs(loss), std::sqrt(tol)) << gpu_loss << " vs " << loss;
    EXPECT_LT(nmse(gdh.get(), dh), tol);
    std::vector<float> gd = gdW.get(), cd = dW;   // compare the accumulated gradient parts
    for (size_t i = 0; i < gd.size(); ++i) { gd[i] -= dW0[i]; cd[i] -= dW0[i]; }
    EXPECT_LT(nmse(gd, cd), tol);
    EXPECT_EQ(bad.get()[0], 0);
}

// The gradient formed in the forward (LmHeadCEAux::unit_dh_out, a frozen head's path), then scaled by the
// backward (unit_dh_in, with per-token scales): dh against the CPU's two passes; the loss is the same bits as
// the forward's without it.
void check_ce_unit(int64_t C, int64_t V, int64_t T, TensorType wt, double tol, std::mt19937 & rng, float softcap = 0.0f,
                   int64_t chunk_rows = 0) {
    SCOPED_TRACE(std::string("unit gradient, ") + gguf::type_name(uint32_t(wt)) + " V=" + std::to_string(V) +
                 " softcap=" + std::to_string(softcap));
    const auto wf = rand_vec(size_t(C * V), rng, -0.2f, 0.2f);
    const auto w = quantized(wt, wf, C, V);
    const size_t rb = gguf::row_bytes(wt, C);
    const auto h = rand_vec(size_t(C * T), rng);
    const auto token_scale = rand_vec(size_t(T), rng, 0.5f, 2.0f);
    std::vector<int32_t> labels(static_cast<size_t>(T));
    for (size_t t = 0; t < labels.size(); ++t) labels[t] = t % 5 == 3 ? -1 : int32_t(rng() % V);
    const float loss_scale = 1.0f / float(T);
    std::vector<float> dh(size_t(C * T));
    rp::cpu::lm_head_ce({C, V, T, 8192, softcap}, h.data(), w.data(), wt, rb, labels.data(), loss_scale, dh.data(), nullptr,
                        0, {.token_scale = token_scale.data()});
    const int64_t chunk = chunk_rows > 0 ? chunk_rows : rp::cuda::ce_chunk_rows(V, T, size_t(4) << 20);
    Dev<uint8_t> gw(w), ws(rp::cuda::lm_head_ce_workspace_bytes(C, V, T, chunk, wt));
    Dev<float> gh(h), gdh(dh.size()), gunit(dh.size()), glse(static_cast<size_t>(T)), grest(static_cast<size_t>(T)), gts(token_scale);
    Dev<int32_t> gl(labels);
    Dev<double> gloss(1), gloss_plain(1);
    Dev<int> bad(1);
    rp::cuda::lm_head_ce({C, V, T, chunk, softcap}, gh.p, gw.p, wt, rb, gl.p, loss_scale, gloss_plain.p, nullptr, nullptr, 0,
                         ws.p, ws.n, bad.p, nullptr);
    rp::cuda::lm_head_ce({C, V, T, chunk, softcap}, gh.p, gw.p, wt, rb, gl.p, loss_scale, gloss.p, nullptr, nullptr, 0, ws.p,
                         ws.n, bad.p, nullptr, {.lse_out = glse.p, .rest_out = grest.p, .unit_dh_out = gunit.p});
    rp::cuda::lm_head_ce({C, V, T, chunk, softcap}, gh.p, gw.p, wt, rb, gl.p, loss_scale, gloss_plain.p, gdh.p, nullptr, 0,
                         ws.p, ws.n, bad.p, nullptr, {.lse_in = glse.p, .rest_in = grest.p, .token_scale = gts.p, .unit_dh_in = gunit.p});
    EXPECT_EQ(gloss.get()[0], gloss_plain.get()[0]);
    EXPECT_LT(nmse(gdh.get(), dh), tol);
    const std::vector<float> got = gdh.get();
    for (int64_t t = 3; t < T; t += 5)
        for (int64_t k = 0; k < C; ++k) ASSERT_EQ(got[size_t(t * C + k)], 0.0f) << "masked token " << t;
    EXPECT_EQ(bad.get()[0], 0);
}

// A streamed head (rp::cuda::lm_head_ce_range over ranges of `per_range` chunks, each from its own device copy of
// its rows, then lm_head_ce_finish): the loss, logsumexps, 1 - p_label and unit gradients are the unstreamed
// CUDA op's bits with the same chunk.
void check_ce_streamed(int64_t C, int64_t V, int64_t T, TensorType wt, int64_t chunk, int64_t per_range, float softcap, std::mt19937 & rng) {
    SCOPED_TRACE(std::string("streamed, ") + gguf::type_name(uint32_t(wt)) + " V=" + std::to_string(V) + " chunk " + std::to_string(chunk) +
                 " x " + std::to_string(per_range) + " softcap=" + std::to_string(softcap));
    const CeProblem pr = make_ce_problem(C, V, T, wt, rng);
    const std::vector<uint8_t> & w = pr.w;
    const size_t rb = pr.rb;
    const std::vector<float> & h = pr.h;
    const std::vector<int32_t> & labels = pr.labels;
    const float loss_scale = 1.0f / float(T);
    Dev<uint8_t> gw(w), ws(rp::cuda::lm_head_ce_workspace_bytes(C, V, T, chunk, wt));
    Dev<float> gh(h), gunit(size_t(C * T)), glse(static_cast<size_t>(T)), grest(static_cast<size_t>(T));
    Dev<int32_t> gl(labels);
    Dev<double> gloss(1);
    Dev<int> bad(1);
    rp::cuda::lm_head_ce({C, V, T, chunk, softcap}, gh.p, gw.p, wt, rb, gl.p, loss_scale, gloss.p, nullptr, nullptr, 0, ws.p, ws.n,
                         bad.p, nullptr, {.lse_out = glse.p, .rest_out = grest.p, .unit_dh_out = gunit.p});
    Dev<uint8_t> state(std::vector<uint8_t>(rp::lm_head_state_layout(C, T, true).bytes, 0xff));  // NaN: the first range must start it
    const rp::cuda::LmHeadCEState st = rp::lm_head_state_at(state.p, C, T, true);
    const int64_t R = chunk * per_range;
    Dev<uint8_t> rws(rp::cuda::lm_head_ce_range_workspace_bytes(C, R, T, chunk, wt));
    for (int64_t v0 = 0; v0 < V; v0 += R) {
        const int64_t nv = std::min(R, V - v0);
        Dev<uint8_t> rows(std::vector<uint8_t>(w.begin() + v0 * int64_t(rb), w.begin() + (v0 + nv) * int64_t(rb)));
        rp::cuda::lm_head_ce_range({C, V, T, chunk, softcap}, v0, nv, gh.p, rows.p, wt, rb, gl.p, st, rws.p, rws.n, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (rows is freed at the end of the iteration)
    }
    Dev<float> sunit(size_t(C * T)), slse(static_cast<size_t>(T)), srest(static_cast<size_t>(T));
    Dev<double> sloss(1);
    Dev<uint8_t> fws(rp::cuda::lm_head_ce_finish_workspace_bytes(T));
    rp::cuda::lm_head_ce_finish({C, V, T, chunk, softcap}, gl.p, loss_scale, st, sloss.p, fws.p, fws.n, bad.p, nullptr,
                                {.lse_out = slse.p, .rest_out = srest.p, .unit_dh_out = sunit.p});
    EXPECT_EQ(sloss.get()[0], gloss.get()[0]);
    EXPECT_TRUE(slse.get() == glse.get());
    EXPECT_TRUE(srest.get() == grest.get());
    EXPECT_TRUE(sunit.get() == gunit.get());
    EXPECT_EQ(bad.get()[0], 0);
}

} // namespace

TEST(CudaCrossEntropy, StreamedRangesGiveTheUnstreamedBits) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(36);
    check_ce_streamed(64, 1003, 23, TensorType::F32, 256, 1, 0.0f, rng);
    check_ce_streamed(64, 1003, 23, TensorType::Q8_0, 100, 3, 0.0f, rng);
    check_ce_streamed(256, 1000, 23, TensorType::Q4_K, 100, 2, 30.0f, rng);  // C > the chunk: label rows through a wider tile
    check_ce_streamed(64, 151936, 37, TensorType::BF16, 4096, 1, 0.0f, rng);
}

TEST(CudaCrossEntropy, GradientFormedInTheForward) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(35);
    check_ce_unit(64, 151936, 37, TensorType::F32, kNmseF32, rng);
    check_ce_unit(64, 1000, 23, TensorType::BF16, kNmseHalf, rng);
    check_ce_unit(64, 1003, 23, TensorType::Q8_0, kNmseF32, rng);
    check_ce_unit(256, 1000, 23, TensorType::Q4_K, kNmseF32, rng, 0.0f, 100);  // C > the chunk: the tile grows for the label rows
    check_ce_unit(64, 1000, 23, TensorType::F32, kNmseF32, rng, 1.0f);
}

TEST(CudaCrossEntropy, Vocab151936) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(31);
    check_ce(64, 151936, 37, TensorType::F32, kNmseF32, rng);
}

// An f16 head at the scale of real training: the 151,936-token vocabulary and the loss scale of a step of 2048
// trained tokens. Most of the head's gradient is then ~1e-9 and the hidden-state gradient ~1e-6: rounded to f16
// as they are, the first flushes to zero and the second loses bits (f16 is subnormal below 6.1e-5); the
// power-of-two scaling of cuda/half_scale.h keeps both at f16's precision, so the CUDA gradients match the
// CPU's (which dequantizes to f32) within the half-precision bound.
TEST(CudaCrossEntropy, F16HeadAtTheRealScale) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(33);
    check_ce(64, 151936, 48, TensorType::F16, kNmseHalf, rng, 1.0f / 2048.0f, true);
}

TEST(CudaCrossEntropy, HalfAndQuantizedHeads) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(32);
    check_ce(64, 1000, 23, TensorType::BF16, kNmseHalf, rng);
    check_ce(64, 1000, 23, TensorType::F16, kNmseHalf, rng);
    check_ce(64, 1003, 23, TensorType::Q8_0, kNmseF32, rng);
}

// Gemma 2's final-logit soft-capping inside the fused head (a cap of 30, Gemma 2's, and of 1, which bends most
// logits), f32 and bf16 heads, over several chunks.
TEST(CudaCrossEntropy, LogitSoftCapping) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(34);
    check_ce(64, 151936, 37, TensorType::F32, kNmseF32, rng, -1.0f, false, 30.0f);
    check_ce(64, 1000, 23, TensorType::F32, kNmseF32, rng, -1.0f, false, 1.0f);
    check_ce(64, 1000, 23, TensorType::BF16, kNmseHalf, rng, -1.0f, false, 30.0f);
}

#endif // RP_HAVE_CUDA
