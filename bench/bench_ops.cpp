// rp-bench ops: the heavy CPU kernels on LLM shapes, next to the machine's own yardsticks measured in the
// same run: the FMA peak of a register-only loop (per core and on all threads) and OpenBLAS cblas_sgemm on
// the same f32 product.
//
//   GEMM    matmul_fwd for f32 / bf16 / q8_0 / q4_0 weights, matmul_bwd_x and matmul_bwd_w (f32), our
//           deterministic OpenBLAS backend (one single-threaded call per fixed tile), and a plain
//           multi-threaded cblas_sgemm; GFLOP/s = 2 K N T / time, and ours / OpenBLAS.
//   attention  causal flash attention forward and backward, tokens/s and GFLOP/s. FLOPs count the causal
//           half of the two T x T x D products per head (2 T^2 D); the backward counts 2.5x the forward, the
//           usual FlashAttention accounting (ours recomputes, so it does more work than it is credited).
//   delta-net  Gated DeltaNet's delta rule (cpu/delta_net.cpp) forward and backward on Qwen3.5's linear-attention
//           shape (Dk = Dv = 128, 16 key and 32 value heads, chunk 64), one sequence of 512 and 4096 tokens. Measured
//           2026-12-07, 2-core Xeon (466 GFLOP/s FMA peak on 2 threads), best of 3, the kernel before and after its
//           columns ran in groups side by side, in the same run: fwd 52.6 -> 27.1 ms (T 512), 439.6 -> 256.5 ms
//           (T 4096); bwd 129.0 -> 88.2 ms, 1080.6 -> 744.5 ms (about 80 and 75 GFLOP/s: 8-float vectors, a
//           sixth of the AVX-512 peak). Then each state column written once per token, not twice (another run):
//           fwd 29.3 -> 26.6 and 273.1 -> 237.7 ms, bwd 95.3 -> 84.8 and 804.1 -> 695.1 ms. 16-float vectors:
//           no faster.
//   head    the fused LM head + cross-entropy forward and backward (Qwen3-0.6B's bf16 head, 512 tokens): a frozen
//           head forming dh in its forward, the same through two passes, a trained head (dh and dW); GFLOP/s of
//           the model's passes. Measured 2026-12-06, 2-core Xeon (492.7 GFLOP/s FMA peak): 338.8 (69%), 236.4
//           (the two passes 1.43x slower), 257.7.
//   matvec  one token's product as generation runs it (matmul_fwd with row dots on: cpu/matvec_dot.h, the
//           column prepared once, every weight row dotted where it lies, rows split over the threads), for every
//           weight type, on a matrix of --matvec-mb MiB, in GB/s of weight bytes next to the read-only stream of
//           the same bytes (each 8-byte word loaded once and XORed, nothing stored; the best of the hardware
//           prefetchers alone and software prefetches 2 and 16 KiB ahead) measured in the same run: the stream is
//           the limit of a product that reads every weight once. Then the software prefetch distance
//           swept for six types (the default is chosen per CPU vendor from such sweeps).
//           Measured 2026-12-06 on a 2-core Intel Xeon (AVX-512 VNNI/BF16, 300 MiB L3), 2 threads, 512 MiB per
//           type, GB/s of weights, the native build next to an AVX2 one (-DRP_NATIVE=OFF -march=haswell) run
//           right after it: f32 32.3 / 30.2, bf16 31.5 / 27.1, q8_0 28.6 / 27.3, q6_k 27.1 / 26.8, q5_k 27.6 / 25.6,
//           q4_k 27.2 / 27.0, q4_0 25.9 / 25.5, q3_k 21.0 / 17.5, q2_k 21.1 / 18.9 (the read stream 31-34 GB/s; the
//           2- and 3-bit types are decode-bound, the others within 80-100% of it). The prefetch sweep: see
//           bench/design-measurements.md (matvec_dot.cpp's prefetch).
#include "bench/bench.h"
#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/gemm_int8.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "ggml_rp/ops/delta_net.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using gguf::TensorType;
using rp::bench::Timing;
using rp::bench::time_it;

int max_threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// ---- FMA peak -------------------------------------------------------------------------------------------------

volatile float g_fma_sink;

// 12 independent FMA chains (more than latency x ports on current cores) on registers only; returns flops.
double fma_loop(int64_t iters) {
#if defined(__AVX512F__)
    using V = __m512;
    constexpr int W = 16;
    auto set = [](float x) { return _mm512_set1_ps(x); };
    auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
    auto sum = [](V a) {
        float t[16];
        _mm512_storeu_ps(t, a);
        float r = 0;
        for (float x : t) r += x;
        return r;
    };
#elif defined(__AVX2__) && defined(__FMA__)
    using V = __m256;
    constexpr int W = 8;
    auto set = [](float x) { return _mm256_set1_ps(x); };
    auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
    auto sum = [](V a) {
        float t[8];
        _mm256_storeu_ps(t, a);
        return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
    };
#else
    using V = float;
    constexpr int W = 1;
    auto set = [](float x) { return x; };
    auto fma = [](V a, V b, V c) { return a * b + c; };
    auto sum = [](V a) { return a; };
#endif
    V acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = set(float(i));
    const V b = set(0.999999f), c = set(1e-7f);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) acc[i] = fma(acc[i], b, c);
    }
    float s = 0;
    for (int i = 0; i < 12; ++i) s += sum(acc[i]);
    g_fma_sink = s;   // keeps the loop alive
    return double(iters) * 12 * W * 2;
}

// GFLOP/s of per_thread() (it returns the flops it did) run on `threads` threads at once, the best of `reps`.
template <class F>
double gflops_on_threads(int threads, int reps, F per_thread) {
    double flops = 0;
    const Timing t = time_it(
        [&] {
            double f = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : f)
#endif
            f += per_thread();
            flops = f;
        },
        reps);
    return flops / t.best_s / 1e9;
}

// GFLOP/s of the packed GEMM's micro-kernel on panels resident in each thread's L1, `threads` threads together:
// the loads and the C tile's updates on top of the FMA loop (2026-12-07, a 2-core Xeon: 87-94% of the FMA peak
// on one thread, 88-90% on two).
double kernel_ceiling(int threads, int reps) {
    return gflops_on_threads(threads, reps, [] { return rp::cpu::gemm_micro_kernel_resident(100'000); });
}

// GFLOP/s of the FMA loop on `threads` threads (all of them together).
double fma_peak(int threads, int reps) {
    return gflops_on_threads(threads, reps, [] { return fma_loop(20'000'000); });
}

// ---- GEMM -----------------------------------------------------------------------------------------------------

struct GemmShape {
    const char * name;
    int64_t K, N, T;
};

double gflops(double flops, const Timing & t) { return t.best_s > 0 ? flops / t.best_s / 1e9 : 0; }

void bench_gemm(const GemmShape & sh, int threads, int reps) {
    const int64_t K = sh.K, N = sh.N, T = sh.T;
    const double flops = 2.0 * double(K) * double(N) * double(T);
    std::printf("\n%s: K=%lld (in) x N=%lld (out) x T=%lld tokens, %.1f GFLOP per product\n", sh.name, (long long)K,
                (long long)N, (long long)T, flops / 1e9);
    // Values: a cheap deterministic pattern (the kernels' speed does not depend on them).
    std::vector<float> W(size_t(K * N)), X(size_t(K * T)), Y(size_t(N * T)), dX(size_t(K * T));
    for (size_t i = 0; i < W.size(); ++i) W[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < X.size(); ++i) X[i] = float(int(i * 40503u % 2001) - 1000) * 1e-3f;

    auto line = [&](const std::string & what, const Timing & t, double ref) {
        const double g = gflops(flops, t);
        std::printf("  %-42s %9.2f ms %9.1f GFLOP/s", what.c_str(), t.best_s * 1e3, g);
        if (ref > 0) std::printf("   %.2fx OpenBLAS", g / ref);
        std::printf("\n");
        return g;
    };

    // OpenBLAS first: the reference the others are compared with.
    double blas = 0;
    if (rp::cpu::gemm_have_blas()) {
        const Timing t = time_it([&] { rp::cpu::openblas_matmul_fwd(K, N, T, W.data(), X.data(), Y.data(), threads); },
                                 reps);
        blas = line(std::string("OpenBLAS cblas_sgemm (") + rp::cpu::openblas_core_name() + ")", t, 0);
    }
    rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Simd);
    line("ours fwd f32", time_it([&] {
             rp::cpu::matmul_fwd(K, N, T, W.data(), TensorType::F32, size_t(K) * 4, X.data(), K, Y.data(), N, false);
         }, reps),
         blas);
    line("ours bwd_x f32", time_it([&] {
             rp::cpu::matmul_bwd_x(K, N, T, W.data(), TensorType::F32, size_t(K) * 4, Y.data(), N, dX.data(), K,
                                   false);
         }, reps),
         blas);
    line("ours bwd_w f32", time_it([&] {
             rp::cpu::matmul_bwd_w(K, N, T, X.data(), K, Y.data(), N, W.data(), K, false);
         }, reps),
         blas);
    if (rp::cpu::gemm_have_blas()) {
        rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Blas);
        line("ours fwd f32 via OpenBLAS tiles (Blas)", time_it([&] {
                 rp::cpu::matmul_fwd(K, N, T, W.data(), TensorType::F32, size_t(K) * 4, X.data(), K, Y.data(), N,
                                     false);
             }, reps),
             blas);
        rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Simd);
    }
    for (TensorType t : {TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0, TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K,
                         TensorType::Q6_K, TensorType::MXFP4}) {
        const int64_t block = gguf::type_traits(uint32_t(t))->block_size;
        if (K % block != 0) {  // (a row of K values is no whole number of blocks: the type cannot hold it)
            std::printf("  ours fwd %-38s (K = %lld is not a multiple of its block of %lld)\n", gguf::type_name(uint32_t(t)),
                        (long long)K, (long long)block);
            continue;
        }
        const size_t rb = gguf::row_bytes(t, K);
        std::vector<uint8_t> Wq(rb * size_t(N));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t n = 0; n < N; ++n) rp::quantize_row(t, W.data() + n * K, Wq.data() + size_t(n) * rb, K);
        line(std::string("ours fwd ") + gguf::type_name(uint32_t(t)), time_it([&] {
                 rp::cpu::matmul_fwd(K, N, T, Wq.data(), t, rb, X.data(), K, Y.data(), N, false);
             }, reps),
             blas);
        if (rp::cpu::int8_matmul_supports(t, K)) {  // the row dots' numerics for a batch (rp-generate's prompts)
            rp::cpu::set_row_dots(true);
            line(std::string("ours fwd ") + gguf::type_name(uint32_t(t)) + " int8 activations", time_it([&] {
                     rp::cpu::matmul_fwd(K, N, T, Wq.data(), t, rb, X.data(), K, Y.data(), N, false);
                 }, reps),
                 blas);
            rp::cpu::set_row_dots(false);
        }
    }
    rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Auto);
}

// ---- attention ------------------------------------------------------------------------------------------------

void bench_attention(int64_t T, int64_t D, int64_t Hq, int64_t Hkv, int reps) {
    const rp::cpu::AttentionShape s{D, Hq, Hkv, T, T, 1, float(1.0 / std::sqrt(double(D)))};
    std::vector<float> q(size_t(D * Hq * T)), k(size_t(D * Hkv * T)), v(k.size()), o(q.size()), lse(size_t(Hq * T));
    std::vector<float> dout(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < k.size(); ++i) k[i] = float(int(i * 40503u % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i * 9973u % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(int(i * 7919u % 2001) - 1000) * 1e-3f;
    const double fwd_flops = 2.0 * double(T) * double(T) * double(D) * double(Hq);
    const Timing tf = time_it([&] { rp::cpu::attention_fwd(s, q.data(), k.data(), v.data(), o.data(), lse.data()); },
                              reps);
    const Timing tb = time_it(
        [&] {
            rp::cpu::attention_bwd(s, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                   dk.data(), dv.data());
        },
        reps);
    std::printf("  T=%-5lld D=%-3lld Hq=%lld Hkv=%lld  fwd %9.2f ms %9.0f tok/s %7.1f GFLOP/s   "
                "bwd %9.2f ms %9.0f tok/s %7.1f GFLOP/s\n",
                (long long)T, (long long)D, (long long)Hq, (long long)Hkv, tf.best_s * 1e3, double(T) / tf.best_s,
                gflops(fwd_flops, tf), tb.best_s * 1e3, double(T) / tb.best_s, gflops(2.5 * fwd_flops, tb));
}

// ---- Gated DeltaNet -------------------------------------------------------------------------------------------

// The delta rule (ops/delta_net.h, cpu/delta_net.cpp) on Qwen3.5's linear-attention shape, one sequence: the
// forward (it saves a state every `chunk` tokens), and the forward with the backward (the backward recomputes each
// chunk's states from the saved one, then walks it back); the backward's time is their difference. FLOPs per token
// and state column of Dk: forward 6 Dk (decay, the prediction, the update) + 2 Dk (the output); backward the
// recompute 6 Dk + 20 Dk (the gradient walk: 10 passes of a multiply-add over the column).
void bench_delta_net(int64_t Dk, int64_t Hk, int64_t Dv, int64_t Hv, int64_t T, int threads, int reps) {
    rp::Context ctx;
    auto leaf = [&](int64_t a, int64_t b, int64_t c, float lo, float hi, uint32_t seed) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::F32, a, b, c, 1);
        ctx.alloc_data(t);
        float * x = t->data_as<float>();
        for (int64_t i = 0; i < t->nelements(); ++i) x[i] = lo + (hi - lo) * float((uint32_t(i) * seed) % 1000u) * 1e-3f;
        return t;
    };
    rp::Tensor * q = leaf(Dk, Hk, T, -0.1f, 0.1f, 2654435761u);
    rp::Tensor * k = leaf(Dk, Hk, T, -0.1f, 0.1f, 40503u);
    rp::Tensor * v = leaf(Dv, Hv, T, -1, 1, 9973u);
    rp::Tensor * g = leaf(Hv, T, 1, -1.0f, -0.02f, 7919u);
    rp::Tensor * beta = leaf(Hv, T, 1, 0.05f, 0.95f, 104729u);
    rp::Tensor * dout = leaf(Dv, Hv, T, -1, 1, 31u);
    rp::Tensor * o = rp::delta_net(ctx, q, k, v, g, beta, 1.0f / std::sqrt(float(Dk)));
    const rp::DeltaNetGrads d = rp::delta_net_back(ctx, o, dout);
    rp::Graph fwd, both;
    rp::build_forward(fwd, o);
    rp::build_forward(both, d.dq);
    rp::CpuBackend be_f, be_b;
    be_f.allocate(fwd);
    be_b.allocate(both);
    const Timing tf = time_it([&] { be_f.compute(fwd, threads); }, reps);
    const Timing tb = time_it([&] { be_b.compute(both, threads); }, reps);
    const double cols = double(T) * double(Dv) * double(Hv), fwd_flops = 8.0 * double(Dk) * cols, bwd_flops = 26.0 * double(Dk) * cols;
    const double bwd_s = std::max(tb.best_s - tf.best_s, 1e-9);
    std::printf("  Dk=%lld Hk=%lld Dv=%lld Hv=%lld T=%-5lld  fwd %8.2f ms %8.0f tok/s %6.1f GFLOP/s   bwd %8.2f ms %8.0f tok/s %6.1f GFLOP/s\n",
                (long long)Dk, (long long)Hk, (long long)Dv, (long long)Hv, (long long)T, tf.best_s * 1e3, double(T) / tf.best_s,
                fwd_flops / tf.best_s / 1e9, bwd_s * 1e3, double(T) / bwd_s, bwd_flops / bwd_s / 1e9);
}

// ---- LM head + cross-entropy ----------------------------------------------------------------------------------

// The fused head (cpu/cross_entropy.h) forward and backward on a bf16 head, three ways: a frozen head whose
// forward forms dh (LoRA's: 2 GEMMs over the head), the same head through two passes (the backward recomputing
// the logits: 3 GEMMs), a trained head (dh and dW: 4 GEMMs). GFLOP/s count the model's passes (2 C V T each: the
// forward, dh, dW), not the recompute.
void bench_head(int64_t C, int64_t V, int64_t T, int reps) {
    std::vector<float> wf(size_t(C * V)), h(size_t(C * T)), dh(h.size()), unit(h.size()), dW;
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-4f;
    for (size_t i = 0; i < h.size(); ++i) h[i] = float(int(i * 40503u % 2001) - 1000) * 1e-3f;
    const size_t rb = gguf::row_bytes(TensorType::BF16, C);
    std::vector<uint8_t> W(rb * size_t(V));
    for (int64_t v = 0; v < V; ++v) rp::quantize_row(TensorType::BF16, wf.data() + v * C, W.data() + size_t(v) * rb, C);
    std::vector<int32_t> labels(static_cast<size_t>(T));
    for (size_t t = 0; t < labels.size(); ++t) labels[t] = int32_t(t * 7919u % uint64_t(V));
    std::vector<float> lse(static_cast<size_t>(T)), rest(static_cast<size_t>(T));
    const rp::cpu::LmHeadCEShape sh{C, V, T, 4096};
    const float scale = 1.0f / float(T);
    const double pass = 2.0 * double(C) * double(V) * double(T);
    auto head = [&](float * dh_out, float * dw, rp::cpu::LmHeadCEAux fwd, rp::cpu::LmHeadCEAux bwd) {
        rp::cpu::lm_head_ce(sh, h.data(), W.data(), TensorType::BF16, rb, labels.data(), scale, nullptr, nullptr, 0, fwd);
        rp::cpu::lm_head_ce(sh, h.data(), W.data(), TensorType::BF16, rb, labels.data(), scale, dh_out, dw, dw ? C : 0, bwd);
    };
    const Timing fused = time_it([&] {
        head(dh.data(), nullptr, {.lse_out = lse.data(), .rest_out = rest.data(), .unit_dh_out = unit.data()},
             {.lse_in = lse.data(), .rest_in = rest.data(), .unit_dh_in = unit.data()});
    }, reps);
    const Timing two = time_it([&] {
        head(dh.data(), nullptr, {.lse_out = lse.data(), .rest_out = rest.data()}, {.lse_in = lse.data(), .rest_in = rest.data()});
    }, reps);
    dW.assign(size_t(C * V), 0.0f);
    const Timing trained = time_it([&] {
        head(dh.data(), dW.data(), {.lse_out = lse.data(), .rest_out = rest.data()}, {.lse_in = lse.data(), .rest_in = rest.data()});
    }, reps);
    std::printf("\nLM head + cross-entropy, bf16 head C=%lld x V=%lld, T=%lld tokens, forward + backward (%.1f GFLOP a pass)\n",
                (long long)C, (long long)V, (long long)T, pass / 1e9);
    std::printf("  frozen, dh formed in the forward (2 GEMMs)   %9.2f ms %9.1f GFLOP/s\n", fused.best_s * 1e3, gflops(2 * pass, fused));
    std::printf("  frozen, two passes (3 GEMMs)                 %9.2f ms %9.1f GFLOP/s   %.2fx the first\n",
                two.best_s * 1e3, gflops(2 * pass, two), two.best_s / fused.best_s);
    std::printf("  trained, dh and dW (4 GEMMs)                 %9.2f ms %9.1f GFLOP/s\n", trained.best_s * 1e3,
                gflops(3 * pass, trained));
}

// ---- matvec (one token) --------------------------------------------------------------------------------------

volatile uint64_t g_read_sink;

// A K x N matrix of type t, about `mib` MiB: a pool of real rows (values quantized as the type's quantizer does)
// tiled to the matrix.
std::vector<uint8_t> matvec_weights(TensorType t, int64_t K, size_t mib, int64_t & N) {
    constexpr int64_t kPool = 64;
    std::vector<float> pool(static_cast<size_t>(K * kPool));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
    const size_t rb = gguf::row_bytes(t, K);
    N = int64_t((mib << 20) / rb);
    std::vector<uint8_t> pq(rb * kPool), W(rb * size_t(N));
    for (int64_t r = 0; r < kPool; ++r) rp::quantize_row(t, pool.data() + r * K, pq.data() + size_t(r) * rb, K);
    for (int64_t n = 0; n < N; ++n) std::memcpy(W.data() + size_t(n) * rb, pq.data() + size_t(n % kPool) * rb, rb);
    return W;
}

void bench_matvec(int64_t K, size_t mib, int threads, int reps) {
    std::printf("\none token through matmul_fwd's row dots (matvec_dot.h, rows over %d threads, software prefetch %lld bytes ahead): K = %lld,\n"
                "about %zu MiB of weights per type\n",
                threads, (long long)rp::cpu::row_prefetch_bytes(), (long long)K, mib);
    std::printf("  %-8s %8s %10s %10s %10s %9s\n", "type", "rows", "ms", "GB/s", "read GB/s", "of read");
    std::vector<float> x(static_cast<size_t>(K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 40503u % 2001) - 1000) * 1e-3f;
    const bool was = rp::cpu::row_dots();
    rp::cpu::set_row_dots(true);
    auto product = [&](TensorType t, const std::vector<uint8_t> & W, int64_t N, std::vector<float> & y) {
        rp::cpu::matmul_fwd(K, N, 1, W.data(), t, gguf::row_bytes(t, K), x.data(), K, y.data(), N, false);
    };
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q6_K, TensorType::Q5_K,
                         TensorType::Q4_K, TensorType::Q4_0, TensorType::Q3_K, TensorType::Q2_K, TensorType::MXFP4}) {
        if (!rp::cpu::row_dot_supports(t, K)) continue;
        int64_t N = 0;
        const std::vector<uint8_t> W = matvec_weights(t, K, mib, N);
        std::vector<float> y(static_cast<size_t>(N));
        const Timing tm = time_it([&] { product(t, W, N, y); }, reps);
        const Timing tr = rp::bench::time_read_stream(W.data(), W.size(), threads, reps, g_read_sink);
        const double bytes = double(W.size()), g = bytes / tm.best_s / 1e9, gr = bytes / tr.best_s / 1e9;
        std::printf("  %-8s %8lld %10.2f %10.2f %10.2f %8.0f%%%s\n", gguf::type_name(uint32_t(t)), (long long)N, tm.best_s * 1e3, g, gr,
                    100.0 * g / gr, rp::cpu::row_dot_is_simd(t) ? "" : "  (portable loop)");
    }
    // The prefetch distance, swept (GB/s), for the default's choice on this CPU.
    std::printf("  prefetch distance (bytes ahead), GB/s:\n  %-8s", "type");
    const int64_t distances[] = {0, 1024, 2048, 4096, 8192, 16384};
    for (int64_t d : distances) std::printf(" %8lld", (long long)d);
    std::printf("\n");
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q2_K}) {
        int64_t N = 0;
        const std::vector<uint8_t> W = matvec_weights(t, K, mib, N);
        std::vector<float> y(static_cast<size_t>(N));
        std::printf("  %-8s", gguf::type_name(uint32_t(t)));
        for (int64_t d : distances) {
            rp::cpu::set_row_prefetch_bytes(d);
            std::printf(" %8.2f", double(W.size()) / time_it([&] { product(t, W, N, y); }, reps).best_s / 1e9);
        }
        std::printf("\n");
    }
    rp::cpu::set_row_prefetch_bytes(-1);
    // A few tokens at once (batched decoding): row dots up to matmul_fwd's limit, beyond it the int8 product
    // (gemm_int8.h) where it takes the type, else the packed GEMM (and with the row dots off, the exact path at
    // every count); and the int8 product itself at every count, where it takes the type. GB/s of weight bytes.
    std::printf("  tokens at once, GB/s of weights (row dots on | off | the int8 product):\n  %-8s", "type");
    const int64_t counts[] = {1, 2, 4, 8, 16, 64};
    for (int64_t T : counts) std::printf("   T=%-2lld on    off   int8", (long long)T);
    std::printf("\n");
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q6_K, TensorType::Q4_K,
                         TensorType::Q4_0, TensorType::Q3_K, TensorType::Q2_K, TensorType::MXFP4}) {
        int64_t N = 0;
        const std::vector<uint8_t> W = matvec_weights(t, K, mib, N);
        std::printf("  %-8s", gguf::type_name(uint32_t(t)));
        for (int64_t T : counts) {
            std::vector<float> xs(static_cast<size_t>(K * T)), y(static_cast<size_t>(N * T));
            for (int64_t i = 0; i < T; ++i) std::copy(x.begin(), x.end(), xs.begin() + i * K);
            auto run = [&] { rp::cpu::matmul_fwd(K, N, T, W.data(), t, gguf::row_bytes(t, K), xs.data(), K, y.data(), N, false); };
            rp::cpu::set_row_dots(true);
            const double on = double(W.size()) / time_it(run, reps).best_s / 1e9;
            rp::cpu::set_row_dots(false);
            const double off = double(W.size()) / time_it(run, reps).best_s / 1e9;
            std::printf(" %7.2f %7.2f", on, off);
            if (rp::cpu::int8_matmul_supports(t, K)) {
                const double i8 = double(W.size()) / time_it([&] {
                    rp::cpu::int8_matmul_fwd(K, N, T, W.data(), t, gguf::row_bytes(t, K), xs.data(), K, y.data(), N, false, true);
                }, reps).best_s / 1e9;
                std::printf(" %7.2f", i8);
            } else {
                std::printf(" %7s", "-");
            }
        }
        std::printf("\n");
    }
    rp::cpu::set_row_dots(was);
}

int run_ops(int argc, char ** argv) {
    bool quick = false;
    int reps = 3, threads = max_threads();
    std::string only, shapes;
    int64_t matvec_mb = 512;
    rp::cli::Options opt("rp-bench ops",
                         "usage: rp-bench ops [--quick] [--reps N] [--threads N] [--only peak|gemm|attention|delta-net|head|matvec] [--shape K,N,T[:K,N,T...]] [--matvec-mb MB]\n"
                         "  FMA peak (1 thread and N threads), then GEMM on LLM shapes (4096x4096x512, 2048x6144x1024 and the\n"
                         "  LM head 2048x151936x512; --quick: 1024x1024x256, 1024x1536x256, 1024x16384x256) for f32, bf16, q8_0\n"
                         "  and q4_0 weights next to OpenBLAS cblas_sgemm, then causal attention forward/backward at T = 512 ..\n"
                         "  8192 (--quick: 512 .. 2048), D = 64 and 128, then the fused LM head + cross-entropy (Qwen3-0.6B's head,\n"
                         "  bf16: a frozen head forming dh in its forward, two passes, a trained head), then one token's product\n"
                         "  (generation's row dots) for every weight type against the read-only stream of its bytes. Best of N\n"
                         "  repetitions (1 for the LM head).");
    opt.flag("--quick", quick, "the smaller shapes");
    opt.integer("--reps", reps, 1, 1 << 20, "repetitions (the best counts)");
    opt.threads(threads, 1, "threads (default: all, OMP_NUM_THREADS)");
    opt.choice("--only", only, {"peak", "gemm", "attention", "delta-net", "head", "matvec"}, "one section", "S");
    opt.integer("--matvec-mb", matvec_mb, 1, 1 << 16, "matvec: MiB of weights per type (past the last-level cache)");
    opt.text("--shape", shapes,
             "GEMM on these shapes instead, ':'-separated (a training step's products: llama-20M is\n"
             "512,512,256:512,1408,256:1408,512,256)",
             "K,N,T");
    if (!opt.parse(argc, argv)) return 0;
    std::vector<GemmShape> custom;
    for (size_t at = 0; at < shapes.size();) {
        const size_t end = std::min(shapes.find(':', at), shapes.size());
        const std::string v = shapes.substr(at, end - at);
        long long k = 0, n = 0, t = 0;
        char tail = 0;
        if (std::sscanf(v.c_str(), "%lld,%lld,%lld%c", &k, &n, &t, &tail) != 3 || k < 1 || n < 1 || t < 1)
            throw rp::Error("--shape: '" + v + "' is not K,N,T (three positive integers)");
        custom.push_back({"--shape", k, n, t});
        at = end + 1;
    }
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#endif
    // OpenBLAS's threads at start: 1 unless OPENBLAS_NUM_THREADS says otherwise (tools/omp_defaults.cpp); its
    // rows below ask for `threads`.
    const int blas_threads = rp::cpu::openblas_threads();
    std::printf("rp-bench ops: %d threads, micro-kernel %s, OpenBLAS %s (%d thread%s at start), best of %d%s\n", threads,
                rp::cpu::gemm_simd_name(), rp::cpu::gemm_have_blas() ? rp::cpu::openblas_core_name() : "not built in",
                blas_threads, blas_threads == 1 ? "" : "s", reps, quick ? ", quick shapes" : "");

    if (rp::cpu::gemm_have_blas() && std::strcmp(rp::cpu::openblas_core_name(), "Prescott") == 0)
        std::printf("note: OpenBLAS did not recognise this CPU and runs its generic SSE3 (Prescott) kernels; run with\n"
                    "      OPENBLAS_CORETYPE=SkylakeX (or Cooperlake, Haswell) to compare with its AVX2/AVX-512 ones\n");
    if (only.empty() || only == "peak") {
        const double p1 = fma_peak(1, reps), pn = fma_peak(threads, reps);
        std::printf("\nFMA peak (register-only loop): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d threads\n", p1, pn,
                    threads);
        const double k1 = kernel_ceiling(1, reps), kn = kernel_ceiling(threads, reps);
        std::printf("GEMM micro-kernel (%s) on L1-resident panels: %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d threads "
                    "(%.0f%% of the FMA peak)\n",
                    rp::cpu::gemm_simd_name(), k1, kn, threads, 100.0 * kn / pn);
    }
    if (only.empty() || only == "gemm") {
        const GemmShape full[] = {{"attention/MLP projection", 4096, 4096, 512},
                                  {"MLP up/gate", 2048, 6144, 1024},
                                  {"LM head (Qwen vocabulary)", 2048, 151936, 512}};
        const GemmShape small[] = {{"projection (quick)", 1024, 1024, 256},
                                   {"MLP up/gate (quick)", 1024, 1536, 256},
                                   {"LM head (quick)", 1024, 16384, 256}};
        if (!custom.empty())
            for (const GemmShape & sh : custom) bench_gemm(sh, threads, reps);
        else
            for (const GemmShape & sh : quick ? small : full)
                bench_gemm(sh, threads, sh.N > 100000 ? 1 : reps);
    }
    if (only.empty() || only == "attention") {
        std::printf("\ncausal attention, one sequence (FLOPs: fwd 2 T^2 D Hq, bwd 2.5x fwd)\n");
        for (int64_t D : {64, 128})
            for (int64_t T = 512; T <= (quick ? 2048 : 8192); T *= 2) bench_attention(T, D, 8, 2, T >= 4096 ? 1 : reps);
    }
    if (only.empty() || only == "delta-net") {
        std::printf("\nGated DeltaNet (the delta rule of Qwen3.5's linear attention, chunk 64), one sequence; FLOPs per token and state "
                    "column: fwd 8 Dk, bwd 26 Dk\n");
        for (int64_t T : {512, quick ? 1024 : 4096}) bench_delta_net(128, 16, 128, 32, T, threads, reps);
    }
    if (only.empty() || only == "head") bench_head(quick ? 512 : 1024, quick ? 16384 : 151936, quick ? 256 : 512, quick ? reps : 1);
    if (only.empty() || only == "matvec") {
        bench_matvec(quick ? 1024 : 4096, quick ? std::min<size_t>(size_t(matvec_mb), 128) : size_t(matvec_mb), threads, reps);
    }
    return 0;
}

} // namespace

RP_BENCH_FAMILY(ops, "CPU kernels: GEMM (every weight type, vs OpenBLAS and the FMA peak), attention fwd/bwd",
                run_ops);
