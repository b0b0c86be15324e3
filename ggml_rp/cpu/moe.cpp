// MOE_TOPK, MOE_WEIGHTS(_BACK): per token, the shared router math of ops/moe_math.h.
// MUL_MAT_ID, MUL_MAT_ID_BACK_X, OUT_PROD_ID: the (token, slot) pairs of each expert are gathered in token
// order (a stable counting sort of the ids), each expert runs one GEMM of gemm.h over its pairs, and the
// results are scattered back; the slot sum of MUL_MAT_ID_BACK_X runs in slot order. Nothing depends on the
// thread count.
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/routing_tape.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/moe.h"
#include "base/error.h"

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
    std::vector<float> xs, ys;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        xs.resize(static_cast<size_t>(K * m));
        ys.resize(static_cast<size_t>(N * m));
        gather(X->data_as<float>(), K, r.pairs.data() + b, m, k, X1, xs.data());
        matmul_fwd(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1], xs.data(), K,
                   ys.data(), N, false);
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(n->data_as<float>() + r.pairs[static_cast<size_t>(b + j)] * N, ys.data() + j * N,
                        static_cast<size_t>(N) * sizeof(float));
    }
}

void mul_mat_id_back_x(Tensor * n) {
    const Tensor * W = n->src[0];
    const Tensor * dY = n->src[1];
    const Tensor * ids = n->src[2];
    const int64_t K = W->ne[0], N = W->ne[1], E = W->ne[2], k = ids->ne[0], T = ids->ne[1], X1 = n->ne[1];
    const Routing r = route(n, ids, E);
    // Every pair's W^T dY first (zero for none), then the slot sum in slot order when the slots share X.
    std::vector<float> per_pair(X1 == 1 ? static_cast<size_t>(K * k * T) : 0);
    float * dst = X1 == 1 ? per_pair.data() : n->data_as<float>();
    std::memset(dst, 0, static_cast<size_t>(K * k * T) * sizeof(float));
    std::vector<float> dys, dxs;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        dys.resize(static_cast<size_t>(N * m));
        dxs.resize(static_cast<size_t>(K * m));
        gather(dY->data_as<float>(), N, r.pairs.data() + b, m, k, k, dys.data());
        matmul_bwd_x(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1], dys.data(),
                     N, dxs.data(), K, false);
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(dst + r.pairs[static_cast<size_t>(b + j)] * K, dxs.data() + j * K, static_cast<size_t>(K) * sizeof(float));
    }
    if (X1 != 1) return;
    float * out = n->data_as<float>();
#pragma omp parallel for schedule(static) if (K * k * T >= min_parallel_elements())
    for (int64_t t = 0; t < T; ++t) {
        float * o = out + t * K;
        const float * src = per_pair.data() + t * k * K;
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
    std::vector<float> xs, dys;
    for (int64_t e = 0; e < E; ++e) {
        float * dw = n->data_as<float>() + e * K * N;
        const int64_t b = r.start[static_cast<size_t>(e)], m = r.start[static_cast<size_t>(e) + 1] - b;
        if (m == 0) {
            if (!accumulate) std::memset(dw, 0, static_cast<size_t>(K * N) * sizeof(float));
            continue;
        }
        xs.resize(static_cast<size_t>(K * m));
        dys.resize(static_cast<size_t>(N * m));
        gather(X->data_as<float>(), K, r.pairs.data() + b, m, k, X1, xs.data());
        gather(dY->data_as<float>(), N, r.pairs.data() + b, m, k, k, dys.data());
        matmul_bwd_w(K, N, m, xs.data(), K, dys.data(), N, dw, K, accumulate);
    }
}

const RegisterKernels kRegister{{Op::MOE_TOPK, moe_topk},     {Op::MOE_WEIGHTS, moe_weights},
                                {Op::MOE_WEIGHTS_BACK, moe_weights_back}, {Op::MUL_MAT_ID, mul_mat_id},
                                {Op::MUL_MAT_ID_BACK_X, mul_mat_id_back_x}, {Op::OUT_PROD_ID, out_prod_id}};

} // namespace rp::cpu
