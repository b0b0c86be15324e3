// MOE_TOPK, MOE_WEIGHTS(_BACK): per token, the shared router math of ops/moe_math.h.
// MUL_MAT_ID, MUL_MAT_ID_BACK_X, OUT_PROD_ID: the (token, slot) pairs of each expert are gathered in token
// order (a stable counting sort of the ids), each expert runs one GEMM of gemm.h over its pairs, and the
// results are scattered back; the slot sum of MUL_MAT_ID_BACK_X runs in slot order. Nothing depends on the
// thread count.
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/cpu/routing_tape.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/moe.h"
#include "base/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace rp::cpu {

namespace {

// Which (token, slot) pairs use each expert, in token order: pairs[start[e] .. start[e+1]) = t * k + s.
struct Routing {
    std::vector<int64_t> start, pairs;
};

Routing route(const Tensor * node, const Tensor * ids, int64_t E) {
    const int32_t * id = ids->data_as<int32_t>();
    const int64_t n = ids->nelements();
    Routing r;
    r.start.assign(static_cast<size_t>(E) + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
        if (id[i] < 0 || id[i] >= E)
            throw Error(std::string(op_name(node->op)) + ": expert id " + std::to_string(id[i]) + " at (slot " +
                        std::to_string(i % ids->ne[0]) + ", token " + std::to_string(i / ids->ne[0]) + ") of " + describe(ids) +
                        " is outside [0, " + std::to_string(E) + ")");
        ++r.start[static_cast<size_t>(id[i]) + 1];
    }
    for (int64_t e = 0; e < E; ++e) r.start[static_cast<size_t>(e) + 1] += r.start[static_cast<size_t>(e)];
    r.pairs.resize(static_cast<size_t>(n));
    std::vector<int64_t> at(r.start.begin(), r.start.end() - 1);
    for (int64_t i = 0; i < n; ++i) r.pairs[static_cast<size_t>(at[static_cast<size_t>(id[i])]++)] = i;
    return r;
}

// Column of pair p = t * k + s in X [K, X1, T]: its slot's, or the token's when X1 == 1.
int64_t x_col(int64_t p, int64_t k, int64_t X1) { return X1 == 1 ? p / k : p; }

void gather(const float * src, int64_t rows, const int64_t * pairs, int64_t n, int64_t k, int64_t X1, float * dst) {
    for (int64_t j = 0; j < n; ++j)
        std::memcpy(dst + j * rows, src + x_col(pairs[j], k, X1) * rows, static_cast<size_t>(rows) * sizeof(float));
}

// The most pairs one expert has.
int64_t widest_expert(const Routing & r) {
    int64_t m = 0;
    for (size_t e = 0; e + 1 < r.start.size(); ++e) m = std::max(m, r.start[e + 1] - r.start[e]);
    return m;
}

// The kernels' scratch for an expert of m pairs: its gathered inputs (a rows each) and outputs (b rows each), and
// before them the per-pair results of MUL_MAT_ID_BACK_X's slot sum (extra floats). Planned (kernel_scratch.h) for
// m = the tokens, which an expert cannot pass when each token picks distinct experts (MOE_TOPK's ids), with the
// largest GEMM pack of such an expert.
size_t gathered_bytes(int64_t a, int64_t b, int64_t m, int64_t extra) {
    return scratch_round(size_t(a * m) * sizeof(float)) + scratch_round(size_t(b * m) * sizeof(float)) +
           scratch_round(size_t(extra) * sizeof(float));
}

} // namespace

void moe_topk(Tensor * n) {
    const Tensor * logits = n->src[0];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    const int32_t k = static_cast<int32_t>(n->ne[0]);
#pragma omp parallel if (T * E >= min_parallel_elements())
    {
        std::vector<float> p(static_cast<size_t>(E));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            moe_softmax(logits->data_as<float>() + t * E, E, p.data());
            moe_select(p.data(), E, k, n->data_as<int32_t>() + t * k);
        }
    }
    if (RoutingTape * tape = RoutingTape::active())  // a gradient check holding the routing fixed
        tape->on_topk(n->data_as<int32_t>(), static_cast<size_t>(k * T), describe(n).c_str());
}

void moe_weights(Tensor * n) {
    const Tensor * logits = n->src[0];
    const Tensor * ids = n->src[1];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    const MoeParams mp = moe_params(n);
#pragma omp parallel if (T * E >= min_parallel_elements())
    {
        std::vector<float> p(static_cast<size_t>(E));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            moe_softmax(logits->data_as<float>() + t * E, E, p.data());
            moe_weights_of(p.data(), ids->data_as<int32_t>() + t * mp.k, mp, n->data_as<float>() + t * mp.k);
        }
    }
}

void moe_weights_back(Tensor * n) {
    const Tensor * logits = n->src[0];
    const Tensor * ids = n->src[1];
    const Tensor * dw = n->src[2];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    const MoeParams mp = moe_params(n);
    std::vector<float> share;  // f_e: the share of the node's (token, slot) pairs routed to each expert
    if (mp.aux != 0.0f) {
        share.assign(static_cast<size_t>(E), 0.0f);
        std::vector<int64_t> count(static_cast<size_t>(E), 0);
        for (int64_t i = 0; i < T * mp.k; ++i) {
            const int32_t e = ids->data_as<int32_t>()[i];
            if (e < 0 || e >= E) throw Error("moe_weights_back: expert id " + std::to_string(e) + " is outside [0, " + std::to_string(E) + ")");
            ++count[static_cast<size_t>(e)];
        }
        for (int64_t e = 0; e < E; ++e)
            share[static_cast<size_t>(e)] = static_cast<float>(count[static_cast<size_t>(e)]) / static_cast<float>(T * mp.k);
    }
#pragma omp parallel if (T * E >= min_parallel_elements())
    {
        std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            moe_softmax(logits->data_as<float>() + t * E, E, p.data());
            moe_weights_grad(p.data(), ids->data_as<int32_t>() + t * mp.k, dw->data_as<float>() + t * mp.k, mp, E, dp.data(),
                             n->data_as<float>() + t * E, share.empty() ? nullptr : share.data());
        }
    }
}

void mul_mat_id(Tensor * n) {
    const Tensor * W = n->src[0];
    const Tensor * X = n->src[1];
    const Tensor * ids = n->src[2];
    const int64_t K = W->ne[0], N = W->ne[1], E = W->ne[2], k = ids->ne[0], X1 = X->ne[1];
    const Routing r = route(n, ids, E);
    std::memset(n->data, 0, n->nbytes());
    const int64_t widest = widest_expert(r);
    Scratch sc(gathered_bytes(K, N, widest, 0));
    float * xs = sc.take<float>(size_t(K * widest));
    float * ys = sc.take<float>(size_t(N * widest));
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        gather(X->data_as<float>(), K, r.pairs.data() + b, m, k, X1, xs);
        matmul_fwd(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1], xs, K, ys, N, false);
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(n->data_as<float>() + r.pairs[static_cast<size_t>(b + j)] * N, ys + j * N, static_cast<size_t>(N) * sizeof(float));
    }
}

void mul_mat_id_back_x(Tensor * n) {
    const Tensor * W = n->src[0];
    const Tensor * dY = n->src[1];
    const Tensor * ids = n->src[2];
    const int64_t K = W->ne[0], N = W->ne[1], E = W->ne[2], k = ids->ne[0], T = ids->ne[1], X1 = n->ne[1];
    const Routing r = route(n, ids, E);
    // Every pair's W^T dY first (zero for none), then the slot sum in slot order when the slots share X.
    const int64_t widest = widest_expert(r);
    Scratch sc(gathered_bytes(N, K, widest, X1 == 1 ? K * k * T : 0));
    float * per_pair = X1 == 1 ? sc.take<float>(size_t(K * k * T)) : nullptr;
    float * dys = sc.take<float>(size_t(N * widest));
    float * dxs = sc.take<float>(size_t(K * widest));
    float * dst = X1 == 1 ? per_pair : n->data_as<float>();
    std::memset(dst, 0, static_cast<size_t>(K * k * T) * sizeof(float));
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        gather(dY->data_as<float>(), N, r.pairs.data() + b, m, k, k, dys);
        matmul_bwd_x(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1], dys, N, dxs,
                     K, false);
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(dst + r.pairs[static_cast<size_t>(b + j)] * K, dxs + j * K, static_cast<size_t>(K) * sizeof(float));
    }
    if (X1 != 1) return;
    float * out = n->data_as<float>();
#pragma omp parallel for schedule(static) if (K * k * T >= min_parallel_elements())
    for (int64_t t = 0; t < T; ++t) {
        float * o = out + t * K;
        const float * src = per_pair + t * k * K;
        std::memcpy(o, src, static_cast<size_t>(K) * sizeof(float));
        for (int64_t s = 1; s < k; ++s)
            for (int64_t i = 0; i < K; ++i) o[i] += src[s * K + i];
    }
}

void out_prod_id(Tensor * n) {
    const Tensor * X = n->src[0];
    const Tensor * dY = n->src[1];
    const Tensor * ids = n->src[2];
    const bool accumulate = n->param_i32(0) != 0;
    const int64_t K = n->ne[0], N = n->ne[1], E = n->ne[2], k = ids->ne[0], X1 = X->ne[1];
    const Routing r = route(n, ids, E);
    const int64_t widest = widest_expert(r);
    Scratch sc(gathered_bytes(K, N, widest, 0));
    float * xs = sc.take<float>(size_t(K * widest));
    float * dys = sc.take<float>(size_t(N * widest));
    for (int64_t e = 0; e < E; ++e) {
        float * dw = n->data_as<float>() + e * K * N;
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) {
            if (!accumulate) std::memset(dw, 0, static_cast<size_t>(K * N) * sizeof(float));
            continue;
        }
        gather(X->data_as<float>(), K, r.pairs.data() + b, m, k, X1, xs);
        gather(dY->data_as<float>(), N, r.pairs.data() + b, m, k, k, dys);
        matmul_bwd_w(K, N, m, xs, K, dys, N, dw, K, accumulate);
    }
}

namespace {

// Each expert of at most T pairs (T: the tokens, ids->ne[1]), and its GEMM's pack.
size_t mul_mat_id_scratch(const Tensor * n) {
    const int64_t K = n->src[0]->ne[0], N = n->src[0]->ne[1], T = n->src[2]->ne[1];
    return gathered_bytes(K, N, T, 0) + matmul_fwd_scratch_bytes(K, N, T);
}
size_t mul_mat_id_back_x_scratch(const Tensor * n) {
    const int64_t K = n->src[0]->ne[0], N = n->src[0]->ne[1], k = n->src[2]->ne[0], T = n->src[2]->ne[1];
    return gathered_bytes(N, K, T, n->ne[1] == 1 ? K * k * T : 0) + matmul_bwd_x_scratch_bytes(K, N, T);
}
size_t out_prod_id_scratch(const Tensor * n) {
    const int64_t K = n->ne[0], N = n->ne[1], T = n->src[2]->ne[1];
    return gathered_bytes(K, N, T, 0) + matmul_bwd_w_scratch_bytes(K, N, T);
}

} // namespace

const RegisterScratch kRegisterScratch{
    {Op::MUL_MAT_ID, mul_mat_id_scratch}, {Op::MUL_MAT_ID_BACK_X, mul_mat_id_back_x_scratch}, {Op::OUT_PROD_ID, out_prod_id_scratch}};

const RegisterKernels kRegister{{Op::MOE_TOPK, moe_topk},     {Op::MOE_WEIGHTS, moe_weights},
                                {Op::MOE_WEIGHTS_BACK, moe_weights_back}, {Op::MUL_MAT_ID, mul_mat_id},
                                {Op::MUL_MAT_ID_BACK_X, mul_mat_id_back_x}, {Op::OUT_PROD_ID, out_prod_id}};

} // namespace rp::cpu
