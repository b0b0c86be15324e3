// matmul_fwd / matmul_bwd_x / matmul_bwd_w / gemm_f32_serial against double-precision triple loops over the
// dequantized weights (rp::dequantize_row), for every weight type, odd shapes, strided columns and
// accumulation; bit-identical results for 1 and 2 threads; every backend (SIMD, portable, OpenBLAS).
#include "ggml_rp/cpu/gemm.h"
#include "base/error.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace kt;
using rp::cpu::GemmBackend;

struct ScopedBackend {
    GemmBackend saved;
    explicit ScopedBackend(GemmBackend b) : saved(rp::cpu::gemm_backend()) { rp::cpu::set_gemm_backend(b); }
    ~ScopedBackend() { rp::cpu::set_gemm_backend(saved); }
};

std::string type_name(TensorType t) { return gguf::type_name(uint32_t(t)); }

// Compares got[i] with ref[i] within bound[i]; reports the first failure and returns the worst error/bound.
double check_all(const std::vector<float> & got, const std::vector<double> & ref, const std::vector<double> & bound,
                 const std::string & what) {
    double worst = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double err = std::fabs(double(got[i]) - ref[i]);
        worst = std::max(worst, err / bound[i]);
        if (!(err <= bound[i])) {
            ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref[i] << " (bound "
                          << bound[i] << ")";
            return worst;
        }
    }
    return worst;
}

// One matmul_fwd case: Y[n, t] (+)= sum_k W[k, n] X[k, t], columns strided when `strided`.
void check_fwd(const Weight & w, int64_t T, bool strided, bool accumulate, Rng & rng) {
    const int64_t K = w.K, N = w.N;
    const int64_t x_col = K + (strided ? 3 : 0), y_col = N + (strided ? 5 : 0);
    const std::vector<float> X = random_floats(size_t(x_col * T), rng);
    std::vector<float> Y = random_floats(size_t(y_col * T), rng);
    const std::vector<float> Y0 = Y;
    rp::cpu::matmul_fwd(K, N, T, w.data(), w.type, w.row_bytes, X.data(), x_col, Y.data(), y_col, accumulate);
    std::vector<float> got;
    std::vector<double> ref, bound;
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t n = 0; n < N; ++n) {
            double acc = 0.0, abs_sum = 0.0;
            for (int64_t k = 0; k < K; ++k) {
                const double p = w.at(k, n) * double(X[size_t(t * x_col + k)]);
                acc += p;
                abs_sum += std::fabs(p);
            }
            const double old = accumulate ? double(Y0[size_t(t * y_col + n)]) : 0.0;
            got.push_back(Y[size_t(t * y_col + n)]);
            ref.push_back(old + acc);
            bound.push_back(dot_bound(K, abs_sum, old));
        }
        // Gaps between strided columns are untouched.
        for (int64_t n = N; n < y_col; ++n) ASSERT_EQ(Y[size_t(t * y_col + n)], Y0[size_t(t * y_col + n)]);
    }
    check_all(got, ref, bound,
              "fwd " + type_name(w.type) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                  " T=" + std::to_string(T) + (accumulate ? " acc" : "") + (strided ? " strided" : ""));
}

// One matmul_bwd_x case: dX[k, t] (+)= sum_n W[k, n] dY[n, t].
void check_bwd_x(const Weight & w, int64_t T, bool strided, bool accumulate, Rng & rng) {
    const int64_t K = w.K, N = w.N;
    const int64_t dy_col = N + (strided ? 7 : 0), dx_col = K + (strided ? 2 : 0);
    const std::vector<float> dY = random_floats(size_t(dy_col * T), rng);
    std::vector<float> dX = random_floats(size_t(dx_col * T), rng);
    const std::vector<float> dX0 = dX;
    rp::cpu::matmul_bwd_x(K, N, T, w.data(), w.type, w.row_bytes, dY.data(), dy_col, dX.data(), dx_col, accumulate);
    std::vector<float> got;
    std::vector<double> ref, bound;
    std::vector<double> acc(static_cast<size_t>(K)), abs_sum(static_cast<size_t>(K));
    for (int64_t t = 0; t < T; ++t) {
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(abs_sum.begin(), abs_sum.end(), 0.0);
        for (int64_t n = 0; n < N; ++n) {
            const double g = dY[size_t(t * dy_col + n)];
            for (int64_t k = 0; k < K; ++k) {
                const double p = w.at(k, n) * g;
                acc[size_t(k)] += p;
                abs_sum[size_t(k)] += std::fabs(p);
            }
        }
        for (int64_t k = 0; k < K; ++k) {
            const double old = accumulate ? double(dX0[size_t(t * dx_col + k)]) : 0.0;
            got.push_back(dX[size_t(t * dx_col + k)]);
            ref.push_back(old + acc[size_t(k)]);
            bound.push_back(dot_bound(N, abs_sum[size_t(k)], old));
        }
        for (int64_t k = K; k < dx_col; ++k) ASSERT_EQ(dX[size_t(t * dx_col + k)], dX0[size_t(t * dx_col + k)]);
    }
    check_all(got, ref, bound,
              "bwd_x " + type_name(w.type) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                  " T=" + std::to_string(T) + (accumulate ? " acc" : "") + (strided ? " strided" : ""));
}

// One matmul_bwd_w case: dW[n, k] (+)= sum_t X[k, t] dY[n, t].
void check_bwd_w(int64_t K, int64_t N, int64_t T, bool strided, bool accumulate, Rng & rng) {
    const int64_t x_col = K + (strided ? 1 : 0), dy_col = N + (strided ? 4 : 0), dw_row = K + (strided ? 6 : 0);
    const std::vector<float> X = random_floats(size_t(x_col * T), rng);
    const std::vector<float> dY = random_floats(size_t(dy_col * T), rng);
    std::vector<float> dW = random_floats(size_t(dw_row * N), rng);
    const std::vector<float> dW0 = dW;
    rp::cpu::matmul_bwd_w(K, N, T, X.data(), x_col, dY.data(), dy_col, dW.data(), dw_row, accumulate);
    std::vector<float> got;
    std::vector<double> ref, bound;
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
            double acc = 0.0, abs_sum = 0.0;
            for (int64_t t = 0; t < T; ++t) {
                const double p = double(X[size_t(t * x_col + k)]) * double(dY[size_t(t * dy_col + n)]);
                acc += p;
                abs_sum += std::fabs(p);
            }
            const double old = accumulate ? double(dW0[size_t(n * dw_row + k)]) : 0.0;
            got.push_back(dW[size_t(n * dw_row + k)]);
            ref.push_back(old + acc);
            bound.push_back(dot_bound(T, abs_sum, old));
        }
        for (int64_t k = K; k < dw_row; ++k) ASSERT_EQ(dW[size_t(n * dw_row + k)], dW0[size_t(n * dw_row + k)]);
    }
    check_all(got, ref, bound,
              "bwd_w K=" + std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T) +
                  (accumulate ? " acc" : "") + (strided ? " strided" : ""));
}

std::vector<int64_t> ks_for(TensorType t) {
    if (block_size(t) == 256) return {256, 512};
    return {32, 64, 96, 256, 512};
}
const std::vector<int64_t> kSizes = {1, 3, 17, 127};

// Every type, K, N and T of the sweep; accumulation and strides alternate over the cases and both are
// covered for every type.
void sweep(TensorType type, bool forward, uint64_t seed) {
    Rng rng(seed);
    int c = 0;
    for (int64_t K : ks_for(type))
        for (int64_t N : kSizes) {
            const Weight w = make_weight(type, K, N, rng, (c % 3 == 0) ? 12 : 0);
            for (int64_t T : kSizes) {
                const bool strided = c % 2 == 1, accumulate = c / 2 % 2 == 1;
                ++c;
                if (forward)
                    check_fwd(w, T, strided, accumulate, rng);
                else
                    check_bwd_x(w, T, strided, accumulate, rng);
                if (::testing::Test::HasFailure()) return;
            }
        }
}

class GemmTypes : public ::testing::TestWithParam<TensorType> {};

TEST_P(GemmTypes, ForwardMatchesDoubleReference) { sweep(GetParam(), true, 100 + uint64_t(GetParam())); }
TEST_P(GemmTypes, BackwardXMatchesDoubleReference) { sweep(GetParam(), false, 200 + uint64_t(GetParam())); }

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, GemmTypes, ::testing::ValuesIn(kt::weight_types()),
                         [](const ::testing::TestParamInfo<TensorType> & i) { return type_name(i.param); });

TEST(Gemm, BackwardWMatchesDoubleReference) {
    Rng rng(7);
    int c = 0;
    for (int64_t K : {32, 64, 96, 256, 512})
        for (int64_t N : kSizes)
            for (int64_t T : kSizes) {
                check_bwd_w(K, N, T, c % 2 == 1, c / 2 % 2 == 1, rng);
                ++c;
            }
    // Reductions over several kGemmKC blocks of tokens.
    check_bwd_w(40, 33, 300, true, true, rng);
    check_bwd_w(64, 17, 700, false, false, rng);
}

// Shapes that cross every blocking boundary (reduction blocks, column tasks, row chunks, partial panels),
// run on 2 threads, plus a row length that is not a multiple of anything (f32 only).
TEST(Gemm, LargeAndOddShapes) {
    ScopedThreads th(2);
    Rng rng(11);
    const Weight wf = make_weight(TensorType::F32, 600, 300, rng, 8);
    check_fwd(wf, 250, true, false, rng);
    check_bwd_x(wf, 131, false, true, rng);
    const Weight wq = make_weight(TensorType::Q4_K, 768, 290, rng);
    check_fwd(wq, 130, false, true, rng);
    check_bwd_x(wq, 125, true, false, rng);
    const Weight wodd = make_weight(TensorType::F32, 172, 45, rng);
    check_fwd(wodd, 29, true, true, rng);
    check_bwd_x(wodd, 29, false, false, rng);
    check_bwd_w(172, 300, 260, true, false, rng);
}

// C[i, j] = sum_p A(i, p) B(p, j) for the four storage orders.
TEST(Gemm, SerialAllTranspositions) {
    Rng rng(13);
    const int64_t M = 37, N = 45, K = 300;
    for (int at = 0; at < 2; ++at)
        for (int bt = 0; bt < 2; ++bt)
            for (int accumulate = 0; accumulate < 2; ++accumulate) {
                const int64_t lda = (at ? M : K) + 3, ldb = (bt ? K : N) + 2, ldc = N + 5;
                const std::vector<float> A = random_floats(size_t(lda * (at ? K : M)), rng);
                const std::vector<float> B = random_floats(size_t(ldb * (bt ? N : K)), rng);
                std::vector<float> Cm = random_floats(size_t(ldc * M), rng);
                const std::vector<float> C0 = Cm;
                rp::cpu::gemm_f32_serial(M, N, K, A.data(), lda, at, B.data(), ldb, bt, Cm.data(), ldc, accumulate);
                std::vector<float> got;
                std::vector<double> ref, bound;
                for (int64_t i = 0; i < M; ++i)
                    for (int64_t j = 0; j < N; ++j) {
                        double acc = 0.0, abs_sum = 0.0;
                        for (int64_t p = 0; p < K; ++p) {
                            const double a = at ? A[size_t(p * lda + i)] : A[size_t(i * lda + p)];
                            const double b = bt ? B[size_t(j * ldb + p)] : B[size_t(p * ldb + j)];
                            acc += a * b;
                            abs_sum += std::fabs(a * b);
                        }
                        const double old = accumulate ? double(C0[size_t(i * ldc + j)]) : 0.0;
                        got.push_back(Cm[size_t(i * ldc + j)]);
                        ref.push_back(old + acc);
                        bound.push_back(dot_bound(K, abs_sum, old));
                    }
                check_all(got, ref, bound,
                          "serial at=" + std::to_string(at) + " bt=" + std::to_string(bt) + " acc=" +
                              std::to_string(accumulate));
            }
}

// Products with at most 8 output columns (LoRA's rank-r sides) take their own loop (gemm.cpp run_few_columns):
// the packed kernel's arithmetic exactly, per reduction block of kGemmKC steps an FMA chain from +0 in step order,
// then C = (add ? C + s : s). Checked against that arithmetic written out with std::fma, bit for bit, for every
// storage order, short row blocks and several blocks of reduction; a 9-column product (the packed kernel) meets
// the same reference, so the two paths give the same bits. Through matmul_fwd / bwd_x / bwd_w too, on 1 and 2
// threads.
TEST(Gemm, FewColumnsAreThePackedKernelsArithmetic) {
    // (A build without AVX2 runs the plain C++ micro-kernel, whose multiply-adds are not fused: so is the reference.)
    const bool fused = std::string(rp::cpu::gemm_simd_name()).rfind("portable", 0) != 0;
    Rng rng(17);
    auto reference = [fused](int64_t M, int64_t N, int64_t K, const std::vector<float> & A, int64_t lda, bool at,
                        const std::vector<float> & B, int64_t ldb, bool bt, std::vector<float> & C, int64_t ldc, bool accumulate) {
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                float c = C[size_t(i * ldc + j)];
                for (int64_t p0 = 0; p0 < K; p0 += rp::cpu::kGemmKC) {
                    float s = 0.0f;
                    for (int64_t p = p0; p < std::min(K, p0 + rp::cpu::kGemmKC); ++p) {
                        const float a = at ? A[size_t(p * lda + i)] : A[size_t(i * lda + p)];
                        const float b = bt ? B[size_t(j * ldb + p)] : B[size_t(p * ldb + j)];
                        s = fused ? std::fma(a, b, s) : a * b + s;
                    }
                    c = (p0 > 0 || accumulate) ? c + s : s;
                }
                C[size_t(i * ldc + j)] = c;
            }
    };
    struct Shape { int64_t M, N, K; };
    for (const Shape sh : {Shape{37, 3, 300}, Shape{16, 8, 513}, Shape{9, 1, 1000}, Shape{200, 8, 700}, Shape{45, 9, 300}})
        for (int at = 0; at < 2; ++at)
            for (int bt = 0; bt < 2; ++bt)
                for (int accumulate = 0; accumulate < 2; ++accumulate) {
                    const int64_t M = sh.M, N = sh.N, K = sh.K;
                    const int64_t lda = (at ? M : K) + 3, ldb = (bt ? K : N) + 2, ldc = N + 5;
                    const std::vector<float> A = random_floats(size_t(lda * (at ? K : M)), rng);
                    const std::vector<float> B = random_floats(size_t(ldb * (bt ? N : K)), rng);
                    std::vector<float> C = random_floats(size_t(ldc * M), rng), want = C;
                    rp::cpu::gemm_f32_serial(M, N, K, A.data(), lda, at, B.data(), ldb, bt, C.data(), ldc, accumulate);
                    reference(M, N, K, A, lda, at, B, ldb, bt, want, ldc, accumulate);
                    EXPECT_TRUE(bit_equal(C, want)) << "M=" << M << " N=" << N << " K=" << K << " at=" << at << " bt=" << bt
                                                    << " acc=" << accumulate;
                }
    // LoRA's three narrow products through the public kernels (in = 96, r = 8, T = 300 tokens), 1 and 2 threads.
    const int64_t in = 96, r = 8, T = 300;
    const std::vector<float> Aw = random_floats(size_t(in * r), rng), X = random_floats(size_t(in * T), rng);
    const std::vector<float> Bw = random_floats(size_t(r * in), rng), dY = random_floats(size_t(in * T), rng);
    for (int threads : {1, 2}) {
        ScopedThreads th(threads);
        std::vector<float> u(size_t(r * T)), du(size_t(r * T)), dB(size_t(r * in), 0.0f);
        rp::cpu::matmul_fwd(in, r, T, Aw.data(), TensorType::F32, size_t(in) * 4, X.data(), in, u.data(), r, false);
        rp::cpu::matmul_bwd_x(r, in, T, Bw.data(), TensorType::F32, size_t(r) * 4, dY.data(), in, du.data(), r, false);
        rp::cpu::matmul_bwd_w(r, in, T, u.data(), r, dY.data(), in, dB.data(), r, false);
        std::vector<float> u_ref(u.size()), du_ref(du.size()), dB_ref(dB.size(), 0.0f);
        reference(T, r, in, X, in, false, Aw, in, true, u_ref, r, false);       // u^T[t, j] = sum_k X^T[t, k] A[j, k]
        reference(T, r, in, dY, in, false, Bw, r, false, du_ref, r, false);     // du^T[t, k] = sum_n dY^T[t, n] B[n, k]
        reference(in, r, T, dY, in, true, u_ref, r, false, dB_ref, r, false);  // dB[n, k] = sum_t dY[t, n] u[t, k]
        EXPECT_TRUE(bit_equal(u, u_ref)) << threads << " threads";
        EXPECT_TRUE(bit_equal(du, du_ref)) << threads << " threads";
        EXPECT_TRUE(bit_equal(dB, dB_ref)) << threads << " threads";
    }
}

// The plain C++ micro-kernel (what a build without AVX2 runs) and the OpenBLAS path on a smaller sweep.
TEST(Gemm, PortableAndBlasBackends) {
    for (GemmBackend b : {GemmBackend::Portable, GemmBackend::Blas}) {
        ScopedBackend sb(b);
        Rng rng(17);
        for (TensorType t : {TensorType::F32, TensorType::Q8_0, TensorType::Q6_K}) {
            const Weight w = make_weight(t, t == TensorType::Q6_K ? 512 : 96, 37, rng, 4);
            check_fwd(w, 19, true, false, rng);
            check_fwd(w, 5, false, true, rng);
            check_bwd_x(w, 19, false, true, rng);
        }
        check_bwd_w(96, 37, 300, true, true, rng);
        const Weight wl = make_weight(TensorType::F32, 520, 270, rng);
        check_fwd(wl, 130, true, true, rng);
    }
}

// Same inputs on 1 and 2 threads give the same bits, on every backend.
TEST(Gemm, DeterministicAcrossThreadCounts) {
    Rng rng(19);
    const int64_t K = 640, N = 530, T = 270;
    const Weight wf = make_weight(TensorType::F32, K, N, rng);
    const Weight wq = make_weight(TensorType::Q5_1, K, N, rng);
    const std::vector<float> X = random_floats(size_t(K * T), rng);
    const std::vector<float> dY = random_floats(size_t(N * T), rng);
    for (GemmBackend b : {GemmBackend::Simd, GemmBackend::Portable, GemmBackend::Blas}) {
        ScopedBackend sb(b);
        auto run_all = [&](int threads) {
            ScopedThreads th(threads);
            std::vector<float> Y(size_t(N * T), 0.5f), Yq(static_cast<size_t>(N * T)), dX(size_t(K * T)), dW(size_t(K * N), 0.25f);
            rp::cpu::matmul_fwd(K, N, T, wf.data(), wf.type, wf.row_bytes, X.data(), K, Y.data(), N, true);
            rp::cpu::matmul_fwd(K, N, T, wq.data(), wq.type, wq.row_bytes, X.data(), K, Yq.data(), N, false);
            rp::cpu::matmul_bwd_x(K, N, T, wq.data(), wq.type, wq.row_bytes, dY.data(), N, dX.data(), K, false);
            rp::cpu::matmul_bwd_w(K, N, T, X.data(), K, dY.data(), N, dW.data(), K, true);
            return std::vector<std::vector<float>>{Y, Yq, dX, dW};
        };
        const auto one = run_all(1), two = run_all(2);
        for (size_t i = 0; i < one.size(); ++i)
            EXPECT_TRUE(bit_equal(one[i], two[i])) << rp::cpu::gemm_backend_name(b) << " output " << i;
    }
}

// The column tasks split the micro-panels evenly into a multiple of the thread count (gemm.cpp run_problem): for
// widths whose panels do not divide evenly (1408 = 44 panels of 32, 530 with a partial last panel, 40 and 33 with
// fewer panels than tasks wanted) and 2, 3 and 4 threads, every column is computed once, as one thread computes it.
// A gap would leave the accumulated output's 0.5 in place; an overlap would add a column's product twice.
TEST(Gemm, EvenColumnTasksCoverEveryColumnOnceForAnyThreadCount) {
    Rng rng(23);
    const int64_t K = 300, T = 61;
    for (const int64_t N : {int64_t(1408), int64_t(530), int64_t(40), int64_t(33)}) {
        const Weight w = make_weight(TensorType::F32, K, N, rng);
        const std::vector<float> X = random_floats(size_t(K * T), rng);
        const std::vector<float> dY = random_floats(size_t(N * T), rng);
        auto run_all = [&](int threads) {
            ScopedThreads th(threads);
            std::vector<float> Y(size_t(N * T), 0.5f), dX(size_t(K * T), 0.5f), dW(size_t(K * N), 0.5f);
            rp::cpu::matmul_fwd(K, N, T, w.data(), w.type, w.row_bytes, X.data(), K, Y.data(), N, true);
            rp::cpu::matmul_bwd_x(K, N, T, w.data(), w.type, w.row_bytes, dY.data(), N, dX.data(), K, true);
            rp::cpu::matmul_bwd_w(K, N, T, X.data(), K, dY.data(), N, dW.data(), K, true);
            return std::vector<std::vector<float>>{Y, dX, dW};
        };
        const auto one = run_all(1);
        // The one-thread run against a double-precision product (so the reference itself is right).
        double worst = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
                double want = 0.5;
                for (int64_t k = 0; k < K; ++k) want += w.at(k, n) * double(X[size_t(t * K + k)]);
                worst = std::max(worst, std::fabs(double(one[0][size_t(t * N + n)]) - want) / (1.0 + std::fabs(want)));
            }
        EXPECT_LT(worst, 1e-5) << "N=" << N;
        for (int threads : {2, 3, 4}) {
            const auto many = run_all(threads);
            for (size_t i = 0; i < one.size(); ++i)
                EXPECT_TRUE(bit_equal(one[i], many[i])) << "N=" << N << ", " << threads << " threads, output " << i;
        }
    }
}

TEST(Gemm, BadInputsThrow) {
    std::vector<uint8_t> w(4096);
    std::vector<float> x(4096), y(4096);
    // 48 is not a multiple of the q4_0 block (32).
    EXPECT_THROW(rp::cpu::matmul_fwd(48, 2, 2, w.data(), TensorType::Q4_0, 64, x.data(), 48, y.data(), 2, false),
                 rp::Error);
    // No dequantizer for q8_1 / i32.
    EXPECT_THROW(rp::cpu::matmul_fwd(32, 2, 2, w.data(), TensorType::Q8_1, 64, x.data(), 32, y.data(), 2, false),
                 rp::Error);
    EXPECT_THROW(rp::cpu::matmul_bwd_x(32, 2, 2, w.data(), TensorType::I32, 128, y.data(), 2, x.data(), 32, false),
                 rp::Error);
    // Row stride shorter than a row.
    EXPECT_THROW(rp::cpu::matmul_fwd(32, 2, 2, w.data(), TensorType::F32, 100, x.data(), 32, y.data(), 2, false),
                 rp::Error);
    try {
        rp::cpu::matmul_fwd(48, 2, 2, w.data(), TensorType::Q4_0, 64, x.data(), 48, y.data(), 2, false);
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
    }
}

TEST(Gemm, EmptyReductionZeroesOrKeeps) {
    std::vector<float> w(1), x(1), y(6, 3.0f);
    rp::cpu::matmul_fwd(0, 3, 2, w.data(), TensorType::F32, 0, x.data(), 0, y.data(), 3, true);
    EXPECT_EQ(y, std::vector<float>(6, 3.0f));
    rp::cpu::matmul_fwd(0, 3, 2, w.data(), TensorType::F32, 0, x.data(), 0, y.data(), 3, false);
    EXPECT_EQ(y, std::vector<float>(6, 0.0f));
}

} // namespace

// Generation evaluates one token (or a few) per step: matmul_fwd with T <= 8 takes another task split (narrow
// column blocks, threads by weight bytes) but must give, for every weight type and thread count, exactly the
// bits of the same columns in one batch, so incremental decoding equals evaluating the sequence at once.
TEST(Gemm, FewTokensEqualTheirColumnsOfABatchBitForBit) {
    Rng rng(23);
    const int64_t K = 512, N = 883, T = 37;  // N: partial micro-panels and an odd number of narrow blocks
    const std::vector<float> X = random_floats(size_t(K * T), rng);
    for (TensorType type : weight_types()) {
        const Weight w = make_weight(type, K, N, rng);
        std::vector<float> batch(size_t(N * T));
        {
            ScopedThreads th(1);
            rp::cpu::matmul_fwd(K, N, T, w.data(), w.type, w.row_bytes, X.data(), K, batch.data(), N, false);
        }
        for (int threads : {1, 2, 3}) {
            ScopedThreads th(threads);
            for (int64_t few : {1, 2, 5, 8}) {
                for (int64_t t0 : {int64_t(0), T - few}) {
                    std::vector<float> y(size_t(N * few));
                    rp::cpu::matmul_fwd(K, N, few, w.data(), w.type, w.row_bytes, X.data() + t0 * K, K, y.data(), N, false);
                    const std::vector<float> want(batch.begin() + t0 * N, batch.begin() + (t0 + few) * N);
                    EXPECT_TRUE(bit_equal(y, want)) << type_name(type) << " T=" << few << " from column " << t0 << ", "
                                                    << threads << " threads";
                }
            }
        }
    }
}

// The one-row product (one token, weight rows read where they lie) on reductions that end mid-vector: f32,
// f16, bf16 rows of any length (its last 1..15 steps loaded apart), before and past one reduction block,
// with fewer rows than a group. Its bits must still be those of the token's column in a batch.
TEST(Gemm, OneTokenOfAnyReductionLengthIsItsBatchColumn) {
    Rng rng(41);
    for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16})
        for (int64_t K : {1, 7, 15, 172, 263, 517})
            for (int64_t N : {5, 45}) {
                const Weight w = make_weight(type, K, N, rng);
                const std::vector<float> X = random_floats(size_t(K * 3), rng);
                std::vector<float> batch(static_cast<size_t>(N * 3)), one(static_cast<size_t>(N));
                rp::cpu::matmul_fwd(K, N, 3, w.data(), w.type, w.row_bytes, X.data(), K, batch.data(), N, false);
                rp::cpu::matmul_fwd(K, N, 1, w.data(), w.type, w.row_bytes, X.data() + K, K, one.data(), N, false);
                EXPECT_TRUE(bit_equal(one, std::vector<float>(batch.begin() + N, batch.begin() + 2 * N)))
                    << type_name(type) << " K=" << K << " N=" << N << " (one-row groups of " << rp::cpu::gemm_one_row_lanes() << ")";
            }
}

// The kernels' own fast decoders (bf16 as a shift, f16 by F16C, q8_0 vectorized; the rest through
// rp::dequantize_row) must give rp::dequantize_row's values exactly: a product with the typed weight equals,
// bit for bit, the product with its f32 decoding, in one-token form and in a batch.
TEST(Gemm, TypedWeightsMultiplyAsTheirF32DecodingBitForBit) {
    Rng rng(29);
    const int64_t K = 768, N = 301;
    for (TensorType type : weight_types()) {
        const Weight w = make_weight(type, K, N, rng);
        Weight f;
        f.type = TensorType::F32;
        f.K = K;
        f.N = N;
        f.row_bytes = size_t(K) * sizeof(float);
        f.bytes.resize(f.row_bytes * size_t(N));
        for (int64_t n = 0; n < N; ++n)
            rp::dequantize_row(type, w.bytes.data() + size_t(n) * w.row_bytes, reinterpret_cast<float *>(f.bytes.data() + size_t(n) * f.row_bytes), K);
        for (int64_t T : {1, 3, 19}) {
            const std::vector<float> X = random_floats(size_t(K * T), rng);
            std::vector<float> yq(size_t(N * T)), yf(size_t(N * T));
            rp::cpu::matmul_fwd(K, N, T, w.data(), w.type, w.row_bytes, X.data(), K, yq.data(), N, false);
            rp::cpu::matmul_fwd(K, N, T, f.data(), f.type, f.row_bytes, X.data(), K, yf.data(), N, false);
            EXPECT_TRUE(bit_equal(yq, yf)) << type_name(type) << " T=" << T;
        }
    }
}
