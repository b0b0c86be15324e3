// The host-side launch configuration of the CUDA kernels (ggml_rp/cuda/launch.h): pure functions, checked
// here on any machine, against the rules written in the header (hand-computed values, not the code's output).
#include "ggml_rp/cuda/launch.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/cuda/half_scale.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace rp::cuda;
using gguf::TensorType;

TEST(CudaLaunch, CeilDivAndRoundUp) {
    EXPECT_EQ(ceil_div(0, 64), 0);
    EXPECT_EQ(ceil_div(1, 64), 1);
    EXPECT_EQ(ceil_div(64, 64), 1);
    EXPECT_EQ(ceil_div(65, 64), 2);
    EXPECT_EQ(ceil_div(8191, 64), 128);
    EXPECT_EQ(round_up(1, 16), 16);
    EXPECT_EQ(round_up(16, 16), 16);
    EXPECT_EQ(round_up(17, 16), 32);
}

TEST(CudaLaunch, ElementwiseGrid) {
    EXPECT_EQ(elementwise_grid(0), 0);
    EXPECT_EQ(elementwise_grid(-5), 0);
    EXPECT_EQ(elementwise_grid(1), 1);
    EXPECT_EQ(elementwise_grid(256), 1);
    EXPECT_EQ(elementwise_grid(257), 2);
    EXPECT_EQ(elementwise_grid(int64_t(256) * 65535), 65535);
    EXPECT_EQ(elementwise_grid(int64_t(1) << 40), 65535);   // capped: the grid-stride loop covers the rest
}

TEST(CudaLaunch, RowThreadsArePowersOfTwoCoveringTheRow) {
    EXPECT_EQ(row_threads(1), 32);
    EXPECT_EQ(row_threads(32), 32);
    EXPECT_EQ(row_threads(33), 64);
    EXPECT_EQ(row_threads(1000), 1024);
    EXPECT_EQ(row_threads(1025), 1024);
    EXPECT_EQ(row_threads(151936), 1024);
    for (int64_t n = 1; n < 3000; n += 7) {
        const int t = row_threads(n);
        EXPECT_EQ(t % 32, 0);
        EXPECT_EQ(t & (t - 1), 0) << n;
        EXPECT_TRUE(t >= n || t == 1024) << n;
        EXPECT_TRUE(t == 32 || t / 2 < n) << n;   // never twice as many threads as elements
    }
}

TEST(CudaLaunch, AttentionHeadDimPadding) {
    EXPECT_EQ(attn_padded_head_dim(1), 16);
    EXPECT_EQ(attn_padded_head_dim(7), 16);
    EXPECT_EQ(attn_padded_head_dim(64), 64);
    EXPECT_EQ(attn_padded_head_dim(72), 80);
    EXPECT_EQ(attn_padded_head_dim(129), 144);
    EXPECT_EQ(attn_padded_head_dim(256), 256);
}

// The forward's shared memory for bq = bk = 64, dp = 128, bf16, counted by hand from the layout:
// Q 16384 + K 16384 + V 16384 + S 16384 + P 8192 + O 32768 + 3 * 256 = 107264 bytes.
TEST(CudaLaunch, AttentionSharedMemoryByHand) {
    EXPECT_EQ(attn_smem_bytes(AttnKernel::Forward, 64, 64, 128, 2), size_t(107264));
    // Backward K/V, bq = bk = 16, dp = 256, bf16: K, V 2*8192, Q, dO 2*8192, S, dP 2*1024, P, dS 2*512,
    // dK, dV 2*16384, lse, Di 2*128 -> 68864.
    EXPECT_EQ(attn_smem_bytes(AttnKernel::BackwardKV, 16, 16, 256, 2), size_t(68864));
    // Backward Q, bq = 32, bk = 16, dp = 16, f32: Q, dO 2*2048, K, V 2*1152 (rows of dp + 1 = 17 floats, the
    // bank-conflict padding of attn_kv_pitch: 16*17*4 = 1088 -> 1152), S, dP 2*2048, dQ 2048, lse, Di 2*128 ->
    // 12800 (with f32 inputs dS overwrites dP in place: no section of its own).
    EXPECT_EQ(attn_smem_bytes(AttnKernel::BackwardQ, 32, 16, 16, 4), size_t(12800));
    // The same in bf16 adds dS, 32*16*2 = 1024: Q, dO, K, V halve -> 2*1024 + 2*512 + 4096 + 1024 + 2048 + 256.
    EXPECT_EQ(attn_smem_bytes(AttnKernel::BackwardQ, 32, 16, 16, 2), size_t(2048 + 1024 + 4096 + 1024 + 2048 + 256));
}

TEST(CudaLaunch, AttentionTilesFitTheLimitForEveryHeadDim) {
    // The opt-in limits of the CI architectures: sm_86/89 99 KiB, sm_80 163 KiB, sm_90 227 KiB.
    const size_t limits[] = {99 * 1024, 163 * 1024, 227 * 1024};
    const AttnKernel kernels[] = {AttnKernel::Forward, AttnKernel::BackwardKV, AttnKernel::BackwardQ};
    for (size_t limit : limits)
        for (AttnKernel k : kernels)
            for (size_t elem : {size_t(2), size_t(4)})
                for (int64_t D = 1; D <= 256; ++D) {
                    const AttnTiles t = attention_tiles(k, D, elem, limit);
                    ASSERT_GT(t.bq, 0) << "D=" << D << " limit=" << limit << " elem=" << elem;
                    EXPECT_EQ(t.bq % 16, 0);
                    EXPECT_EQ(t.bk % 16, 0);
                    EXPECT_EQ(t.dp % 16, 0);
                    EXPECT_GE(t.dp, D);
                    EXPECT_LT(t.dp - D, 16);
                    EXPECT_LE(t.smem, limit);
                    EXPECT_EQ(t.smem, attn_smem_bytes(k, t.bq, t.bk, t.dp, elem));
                }
}

// The f32 kernels pad the key / value rows by one float so that a warp reading a column touches 32 banks;
// the wmma path keeps the padded head dim (wmma needs a multiple of 8 elements).
TEST(CudaLaunch, KeyAndValueTilesArePaddedForTheF32Kernels) {
    for (int64_t dp : {16, 64, 128, 256}) {
        EXPECT_EQ(attn_kv_pitch(dp, 4), dp + 1);
        bool bank[32] = {};  // an odd pitch: 32 consecutive rows start in 32 different banks
        for (int64_t row = 0; row < 32; ++row) bank[(row * attn_kv_pitch(dp, 4)) % 32] = true;
        for (bool b : bank) EXPECT_TRUE(b) << dp;
        EXPECT_EQ(attn_kv_pitch(dp, 2), dp);
        EXPECT_EQ(attn_kv_pitch(dp, 2) % 8, 0);
    }
    const AttnTiles t = attention_tiles(AttnKernel::Forward, 128, 4, 227 * 1024);
    EXPECT_EQ(t.kp, 129);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 128, 2, 227 * 1024).kp, 128);
}

// The tile chooser leaves room for the kernel's static shared memory: dynamic + static <= the opt-in limit.
TEST(CudaLaunch, AttentionTilesCountStaticSharedMemory) {
    const size_t limit = 99 * 1024;
    const AttnTiles free_of_static = attention_tiles(AttnKernel::Forward, 128, 2, limit);
    ASSERT_GT(free_of_static.bq, 0);
    const size_t margin = limit - free_of_static.smem;
    // A kernel whose static shared memory eats the margin and a byte more cannot keep that tile.
    const AttnTiles with_static = attention_tiles(AttnKernel::Forward, 128, 2, limit, margin + 1);
    ASSERT_GT(with_static.bq, 0);
    EXPECT_LT(with_static.bq * with_static.bk, free_of_static.bq * free_of_static.bk);
    EXPECT_LE(with_static.smem + margin + 1, limit);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 128, 2, limit, margin).smem, free_of_static.smem);
    for (AttnKernel k : {AttnKernel::Forward, AttnKernel::BackwardKV, AttnKernel::BackwardQ})
        for (int64_t D : {1, 64, 128, 256}) {
            const AttnTiles t = attention_tiles(k, D, 2, limit, 4096);
            if (t.bq > 0) {
                EXPECT_LE(t.smem + 4096, limit);
            }
        }
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 64, 2, limit, limit).bq, 0);  // nothing fits beside it
}

TEST(CudaLaunch, AttentionTilesPreferTheLargestShape) {
    // Small head dims get the 64 x 64 tile everywhere; more shared memory never gives a smaller tile.
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 64, 2, 99 * 1024).bq, 64);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 64, 2, 99 * 1024).bk, 64);
    for (int64_t D : {16, 64, 128, 200, 256})
        for (AttnKernel k : {AttnKernel::Forward, AttnKernel::BackwardKV, AttnKernel::BackwardQ}) {
            const AttnTiles a = attention_tiles(k, D, 2, 99 * 1024), b = attention_tiles(k, D, 2, 227 * 1024);
            EXPECT_GE(b.bq * b.bk, a.bq * a.bk) << D;
        }
    // D = 256, bf16, backward K/V on 99 KiB: 64x64 needs far more; the first fit in the order is 16 x 16
    // (32 x 16 needs 2*16384 + 2*16384... = 92928 + ... > 99 KiB is checked by the limit rule above).
    const AttnTiles t = attention_tiles(AttnKernel::BackwardKV, 256, 2, 99 * 1024);
    EXPECT_LE(t.smem, size_t(99 * 1024));
    EXPECT_GT(attn_smem_bytes(AttnKernel::BackwardKV, 64, 64, 256, 2), size_t(99 * 1024));
}

TEST(CudaLaunch, AttentionRejectsBadHeadDims) {
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 0, 2, 1 << 20).bq, 0);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 257, 2, 1 << 20).bq, 0);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 64, 3, 1 << 20).bq, 0);
    EXPECT_EQ(attention_tiles(AttnKernel::Forward, 64, 2, 1024).bq, 0);   // nothing fits 1 KiB
}

TEST(CudaLaunch, AttentionGridCountsTilesOfOddShapes) {
    AttnTiles t;
    t.bq = 64;
    t.bk = 32;
    t.dp = 64;
    // Tq = 1: one query tile; Tq = 65: two; Tk = 8191 with bk = 32: 256 key tiles.
    Grid3 g = attention_grid(AttnKernel::Forward, 1, 1, 8, 2, 3, t);
    EXPECT_EQ(g.x, 1);
    EXPECT_EQ(g.y, 8);
    EXPECT_EQ(g.z, 3);
    g = attention_grid(AttnKernel::BackwardQ, 65, 100, 8, 2, 1, t);
    EXPECT_EQ(g.x, 2);
    EXPECT_EQ(g.y, 8);
    g = attention_grid(AttnKernel::BackwardKV, 65, 8191, 8, 2, 1, t);
    EXPECT_EQ(g.x, 256);
    EXPECT_EQ(g.y, 2);   // one block row per kv head: it owns dK/dV of the whole group
    g = attention_grid(AttnKernel::Forward, 0, 0, 8, 2, 1, t);
    EXPECT_EQ(g.x, 0);
    EXPECT_EQ(attention_grid(AttnKernel::Forward, 5, 5, 1, 1, 1, AttnTiles{}).x, 0);
    EXPECT_EQ(attention_bwd_workspace_bytes(8, 100, 3), size_t(8 * 100 * 3 * 4));
    EXPECT_EQ(attention_bwd_workspace_bytes(8, 0, 3), size_t(4));
}

TEST(CudaLaunch, MatmulWorkspace) {
    EXPECT_EQ(matmul_workspace_bytes(4096, 4096, 512, TensorType::F32), size_t(0));
    // f16/bf16: the larger activation side rounded to 2 bytes: max(K, N) * T * 2.
    // f16: the 256-byte header of the power-of-two scale (half_scale.h), then the rounded activations.
    EXPECT_EQ(matmul_workspace_bytes(4096, 1024, 512, TensorType::F16), size_t(256 + 4096 * 512 * 2));
    EXPECT_EQ(matmul_workspace_bytes(1024, 4096, 512, TensorType::BF16), size_t(4096 * 512 * 2));
    // block types: the dequantized f32 weight K * N * 4, rounded up to 256 bytes.
    // Quantized: one dequantized tile of whole rows, kDequantTileBytes at most (16 MiB: 1024 rows of 4096).
    EXPECT_EQ(dequant_tile_rows(4096, 11008), 1024);
    EXPECT_EQ(matmul_workspace_bytes(4096, 11008, 7, TensorType::Q4_K), size_t(4096) * 1024 * 4);
    EXPECT_EQ(dequant_tile_rows(1 << 23, 4), 1);  // a row larger than the budget still gets one row
    EXPECT_EQ(matmul_workspace_bytes(32, 3, 1, TensorType::Q8_0), size_t(512));   // 384 -> 512
    EXPECT_EQ(matmul_workspace_bytes(3, 3, 3, TensorType::F16), size_t(512));     // 256 + 18 -> 512
}

TEST(CudaLaunch, CrossEntropyChunks) {
    // 64 MiB of logits for 512 tokens: 32768 rows; the whole vocabulary when it is smaller.
    EXPECT_EQ(ce_chunk_rows(151936, 512, size_t(64) << 20), 32768);
    EXPECT_EQ(ce_chunk_rows(1000, 512, size_t(64) << 20), 1000);
    // A tiny budget still gives one row; an odd budget is rounded down to a multiple of 256.
    EXPECT_EQ(ce_chunk_rows(151936, 8192, 16), 1);
    EXPECT_EQ(ce_chunk_rows(151936, 1, 4 * 1000), 768);
    EXPECT_EQ(ce_chunk_rows(151936, 1, 4 * 100), 100);
    EXPECT_EQ(ce_chunk_rows(151936, 0, 4 * 300), 256);
    // Workspace: tile max(nv, C)*T*4 + GEMM scratch + per-token arrays (8 of 4 bytes, 3 doubles, 256-aligned).
    const int64_t C = 64, V = 1000, T = 10, chunk = 300;
    const size_t tile = (300 * 10 * 4 + 255) / 256 * 256;   // 12032
    const size_t tok = 256 * 8 + 256 * 3;
    EXPECT_EQ(lm_head_ce_workspace_bytes(C, V, T, chunk, TensorType::F32), tile + tok);
    EXPECT_EQ(lm_head_ce_workspace_bytes(C, V, T, chunk, TensorType::Q8_0), tile + size_t(64 * 300 * 4) + tok);
    EXPECT_EQ(lm_head_ce_workspace_bytes(C, V, T, 5000, TensorType::F32),
              (size_t(1000 * 10 * 4) + 255) / 256 * 256 + tok);   // chunk > V: one chunk of V rows
    // chunk < C: the tile holds the C x T label rows the gradient formed in the forward gathers
    EXPECT_EQ(lm_head_ce_workspace_bytes(C, V, T, 16, TensorType::F32), size_t(64 * 10 * 4) + tok);
}

TEST(CudaLaunch, GetRowsBackWorkspace) {
    EXPECT_EQ(get_rows_back_workspace_bytes(0), size_t(64 * 8));
    EXPECT_EQ(get_rows_back_workspace_bytes(64), size_t(64 * 8));
    EXPECT_EQ(get_rows_back_workspace_bytes(65), size_t(128 * 8));
}

// The power-of-two scale of an f16 GEMM operand (cuda/half_scale.h): the largest magnitude lands in
// [2^14, 2^15), safely below f16's 65504, and a head gradient of ~1e-9 (loss scale 1/2048 over a 151,936-token
// vocabulary) survives the rounding instead of flushing to zero.
TEST(CudaLaunch, HalfScaleKeepsSmallGradientsInF16Range) {
    using rp::cuda::half_scale_exponent;
    for (float m : {1e-12f, 1e-9f, 3e-7f, 6e-5f, 0.5f, 1.0f, 1.5f, 300.0f, 16384.0f, 6e4f, 1e6f, 3e9f}) {
        const int k = half_scale_exponent(m);
        const double scaled = std::ldexp(static_cast<double>(m), k);
        EXPECT_GE(scaled, 16384.0) << m;
        EXPECT_LT(scaled, 32768.0) << m;
    }
    EXPECT_EQ(half_scale_exponent(0.0f), 0);
    EXPECT_EQ(half_scale_exponent(INFINITY), 0);
    EXPECT_EQ(half_scale_exponent(NAN), 0);
    EXPECT_EQ(half_scale_exponent(-1.0f), 0);  // the kernel passes |x|
    // A gradient column whose largest entry is 2e-9 and smallest 3e-12: unscaled, f16 keeps nothing of them.
    const float g[] = {2e-9f, -1.3e-9f, 7e-10f, 3e-12f};
    const int k = half_scale_exponent(2e-9f);
    for (float v : g) {
        EXPECT_EQ(rp::fp16_to_fp32(rp::fp32_to_fp16(v)), 0.0f) << v;  // the defect: flushed to zero
        const float back = std::ldexp(rp::fp16_to_fp32(rp::fp32_to_fp16(std::ldexp(v, k))), -k);
        // f16 keeps 11 significant bits for normal values; 3e-12 * 2^k is still normal (>= 2^-14 of 2^14).
        EXPECT_NEAR(back, v, std::fabs(v) * std::ldexp(1.0, -10)) << v;
    }
}

// The scale of the f16 attention backward's dout (half_scale.h, attention_grad_scale_exponent), emulated on
// the host for one query row: dO ~ 1e-7 (below f16's normal range: unscaled, rounding loses it), V up to 3,
// D = 128, 40 keys. Scaled, dO and dS = P (dP - D_i) stay below f16's largest value, and dS computed from the
// f16-rounded scaled dO and rounded to f16 itself, then unscaled, is within f16's precision of the exact one.
TEST(CudaLaunch, AttentionGradScaleKeepsDoutAndDsInF16Range) {
    using rp::cuda::attention_grad_scale_exponent;
    std::mt19937 rng(5);
    const int D = 128, J = 40;
    for (float mag : {1e-9f, 1e-7f, 1e-3f, 1.0f, 50.0f}) {
        std::uniform_real_distribution<float> ud(-mag, mag), uv(-3.0f, 3.0f), us(-4.0f, 4.0f);
        std::vector<float> dO(D), V(size_t(J * D)), P(J);
        for (float & x : dO) x = ud(rng);
        for (float & x : V) x = uv(rng);
        double z = 0;
        for (float & p : P) z += (p = std::exp(us(rng)));
        for (float & p : P) p = static_cast<float>(p / z);
        float max_do = 0, max_v = 0;
        for (float x : dO) max_do = std::max(max_do, std::fabs(x));
        for (float x : V) max_v = std::max(max_v, std::fabs(x));
        const int k = attention_grad_scale_exponent(max_do, max_v, D);
        auto f16 = [](double x) { return static_cast<double>(rp::fp16_to_fp32(rp::fp32_to_fp16(static_cast<float>(x)))); };
        // dS in double from dO as given (exact) and from 2^k dO rounded to f16 (what the kernel sees).
        auto ds_of = [&](bool rounded) {
            std::vector<double> o(D, 0.0), d(D), ds(J);
            for (int e = 0; e < D; ++e) d[size_t(e)] = rounded ? f16(std::ldexp(double(dO[size_t(e)]), k)) : double(dO[size_t(e)]);
            for (int j = 0; j < J; ++j)
                for (int e = 0; e < D; ++e) o[size_t(e)] += double(P[size_t(j)]) * V[size_t(j * D + e)];
            double di = 0;
            for (int e = 0; e < D; ++e) di += d[size_t(e)] * o[size_t(e)];
            for (int j = 0; j < J; ++j) {
                double dp = 0;
                for (int e = 0; e < D; ++e) dp += d[size_t(e)] * V[size_t(j * D + e)];
                ds[size_t(j)] = double(P[size_t(j)]) * (dp - di);
            }
            return ds;
        };
        const std::vector<double> exact = ds_of(false), scaled = ds_of(true);
        double num = 0, den = 0;
        for (int e = 0; e < D; ++e) EXPECT_LT(std::fabs(std::ldexp(double(dO[size_t(e)]), k)), 65504.0) << mag;
        for (int j = 0; j < J; ++j) {
            EXPECT_LT(std::fabs(scaled[size_t(j)]), 65504.0) << mag;  // dS is rounded to f16 too
            const double back = std::ldexp(f16(scaled[size_t(j)]), -k);
            num += (back - exact[size_t(j)]) * (back - exact[size_t(j)]);
            den += exact[size_t(j)] * exact[size_t(j)];
        }
        EXPECT_LT(std::sqrt(num / den), 2e-3) << "dout magnitude " << mag;
    }
    // Without the scale, f16 keeps nothing of a dO of 1e-8 (the defect this guards against).
    EXPECT_EQ(rp::fp16_to_fp32(rp::fp32_to_fp16(1e-8f)), 0.0f);
}
