// The CUDA graph backend against the CPU backend: small graphs of every op family (element-wise and dropout,
// row-wise, rope, copy/reduce, embedding, GEMMs, attention, LM head + cross-entropy) and a whole autodiff
// training graph run on both from the same leaf data; every output and every accumulated buffer is compared by
// NMSE with ggml's test-backend-ops thresholds. Also: the arena counts the backend's memory, bad ids are
// reported by check(), host-pointer leafs and unsupported nodes are refused by name. Skipped without a CUDA
// device.
#include "cuda_test_util.h"

#if defined(RP_HAVE_CUDA)

#include "ggml_rp/core/quant.h"
#include "ggml_rp/cuda/backend.h"
#include "ggml_rp/cuda/cuda_device.h"
#include "base/error.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>

using cutest::kNmseF32;
using cutest::kNmseHalf;
using cutest::nmse;
using cutest::rand_vec;

namespace {

// A graph built on the host; run() computes it with CpuBackend and with CudaBackend from the same leaf data
// and returns, per output (and per leaf it reads back, e.g. accumulated gradients), both results.
struct Bench {
    rp::Context ctx;
    std::mt19937 rng{1234};
    std::vector<rp::Tensor *> outputs;
    std::vector<rp::Tensor *> read_leafs;  // leafs the graph writes into (gradients, accumulators)
    std::vector<double> tolerance;         // per output, then per read leaf

    rp::Tensor * f32(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1, float lo = -1, float hi = 1) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::F32, ne0, ne1, ne2, ne3);
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, rand_vec(size_t(t->nelements()), rng, lo, hi));
        return t;
    }
    rp::Tensor * typed(rp::DType type, int64_t ne0, int64_t ne1) {  // f16, bf16 or a block type
        rp::Tensor * t = ctx.new_tensor(type, ne0, ne1);
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, rand_vec(size_t(t->nelements()), rng));
        return t;
    }
    rp::Tensor * ids(std::vector<int32_t> v) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::I32, static_cast<int64_t>(v.size()));
        ctx.alloc_data(t);
        rp::tensor_set_i32(t, v);
        return t;
    }
    void out(rp::Tensor * t, double tol = kNmseF32) {
        outputs.push_back(t);
        tolerance.push_back(tol);
    }
    void read_back(rp::Tensor * leaf) { read_leafs.push_back(leaf); }

    struct Result {
        std::string what;
        std::vector<float> cpu, gpu;
        double tol;
    };

    std::vector<Result> run(rp::Graph & g, bool graph_built = false) {
        if (!graph_built) {
            for (rp::Tensor * t : outputs) rp::build_forward(g, t);
        }
        for (rp::Tensor * t : outputs) {
            t->flags |= rp::kFlagOutput;
            if (t->view_src) t->view_src->flags |= rp::kFlagOutput;
        }
        // The leafs' initial bytes, so the GPU starts from what the CPU started from.
        std::map<rp::Tensor *, std::vector<uint8_t>> init;
        for (rp::Tensor * l : g.leafs) {
            if (!l->data) throw rp::Error("Bench: leaf " + rp::describe(l) + " has no data to start both backends from");
            const auto * p = static_cast<const uint8_t *>(l->data);
            init[l].assign(p, p + l->nbytes());
        }
        std::vector<Result> res;
        {
            rp::CpuBackend cpu;
            cpu.allocate(g);
            cpu.compute(g);
            for (size_t i = 0; i < outputs.size(); ++i)
                res.push_back({"output " + rp::describe(outputs[i]), rp::tensor_get_f32(outputs[i]), {}, tolerance[i]});
            for (size_t i = 0; i < read_leafs.size(); ++i)
                res.push_back({"leaf " + rp::describe(read_leafs[i]), rp::tensor_get_f32(read_leafs[i]), {},
                               tolerance.size() > outputs.size() + i ? tolerance[outputs.size() + i] : kNmseF32});
        }

        rp::CudaDeviceOptions o;
        o.memory_bytes = size_t(256) << 20;
        rp::CudaDevice dev(0, o);
        rp::Stream & up = dev.stream(rp::StreamKind::WeightUpload);
        std::map<rp::Tensor *, void *> host_ptr;
        for (rp::Tensor * l : g.leafs) {
            host_ptr[l] = l->data;
            void * d = dev.allocate(l->nbytes(), "leaf " + rp::describe(l));
            up.copy(d, init[l].data(), init[l].size(), rp::CopyKind::HostToDevice, "leaf");
            l->data = d;
        }
        up.synchronize();
        {
            rp::CudaBackend be(dev);
            const size_t peak = be.allocate(g);
            EXPECT_GE(dev.used(), peak + be.workspace_size());
            rp::Stream & s = dev.stream(rp::StreamKind::Compute);
            be.compute(g, s);
            s.synchronize();
            be.check();
            auto download = [&](const rp::Tensor * t) {
                std::vector<uint8_t> host(t->nbytes());
                EXPECT_EQ(cudaMemcpy(host.data(), t->data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
                rp::Tensor h = *t;  // the same shape and strides over the host copy
                h.view_src = nullptr;
                h.data = host.data();
                return rp::tensor_get_f32(&h);
            };
            for (size_t i = 0; i < outputs.size(); ++i) res[i].gpu = download(outputs[i]);
            for (size_t i = 0; i < read_leafs.size(); ++i) res[outputs.size() + i].gpu = download(read_leafs[i]);
        }
        for (rp::Tensor * l : g.leafs) {
            dev.free(l->data);
            l->data = host_ptr[l];
        }
        return res;
    }

    void run_and_compare() {
        rp::Graph g;
        check(run(g));
    }

    static void check(const std::vector<Result> & res) {
        for (const Result & r : res) {
            ASSERT_EQ(r.cpu.size(), r.gpu.size()) << r.what;
            const double e = nmse(r.gpu, r.cpu);
            EXPECT_LT(e, r.tol) << r.what;
            bool finite = true;
            for (float v : r.gpu) finite = finite && std::isfinite(v);
            EXPECT_TRUE(finite) << r.what;
        }
    }
};

} // namespace

TEST(CudaBackend, ElementwiseOps) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * x = b.f32(37, 5, 3, 1, -6, 6);
    rp::Tensor * y = b.f32(37, 5, 3);
    rp::Tensor * z = b.f32(37, 5, 3);
    rp::Tensor * bc = b.f32(37, 1, 3);
    rp::Tensor * row = b.f32(1, 5, 1);
    b.out(rp::add(c, x, bc));
    b.out(rp::mul(c, x, row));
    b.out(rp::add(c, x, y));
    b.out(rp::scale(c, x, -0.37f));
    b.out(rp::silu(c, x));
    b.out(rp::silu_back(c, x, y));
    b.out(rp::swiglu(c, x, y));
    b.out(rp::swiglu_back(c, x, y, z, 0));
    b.out(rp::swiglu_back(c, x, y, z, 1));
    // Strided operands (packed by the backend through scratch).
    rp::Tensor * m = b.f32(37, 15);
    b.out(rp::silu(c, rp::transpose(c, m)));
    b.out(rp::mul(c, rp::transpose(c, m), rp::transpose(c, b.f32(37, 15))));
    // Dropout: the same mask bits on both backends (a counter-based RNG), packed source included.
    b.out(rp::dropout(c, x, 0.3f, 0x1234abcdULL, 7));
    b.out(rp::dropout(c, rp::transpose(c, m), 0.5f, 99, 1000));
    b.run_and_compare();
}

TEST(CudaBackend, RowOpsAndRope) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * x = b.f32(1000, 7, 1, 1, -8, 8);
    rp::Tensor * dy = b.f32(1000, 7);
    rp::Tensor * w = b.f32(1000, 1, 1, 1, 0.5f, 1.5f);
    rp::Tensor * sm = rp::softmax(c, x);
    b.out(sm);
    b.out(rp::softmax_back(c, sm, dy));
    b.out(rp::rms_norm(c, x, nullptr, 1e-6f));
    b.out(rp::rms_norm(c, x, w, 1e-6f));
    b.out(rp::rms_norm_back(c, x, w, dy, 1e-6f));
    b.out(rp::rms_norm_back(c, x, nullptr, dy, 1e-5f));
    // The gated norm (Qwen3.5's output norm) and its two gradients, with and without a weight; strided operands packed.
    rp::Tensor * z = b.f32(1000, 7, 1, 1, -6, 6);
    b.out(rp::rms_norm_gated(c, x, w, z, 1e-6f));
    b.out(rp::rms_norm_gated(c, x, nullptr, z, 1e-6f));
    for (int which : {0, 1}) {
        b.out(rp::rms_norm_gated_back(c, x, w, z, dy, 1e-6f, which));
        b.out(rp::rms_norm_gated_back(c, x, nullptr, z, dy, 1e-6f, which));
    }
    b.out(rp::rms_norm_gated(c, rp::transpose(c, b.f32(7, 33)), nullptr, rp::transpose(c, b.f32(7, 33)), 1e-6f));
    b.out(rp::softmax(c, rp::transpose(c, b.f32(7, 33))));  // strided rows
    rp::Tensor * h = b.f32(64, 3, 5, 2);
    std::vector<int32_t> pos(10);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i * 977 % 5000);
    rp::Tensor * p = b.ids(pos);
    for (bool neox : {false, true}) {
        rp::RopeParams rp_;
        rp_.n_rot = 48;
        rp_.mode = neox ? rp::RopeMode::Neox : rp::RopeMode::Normal;
        rp_.freq_base = 1000000.0f;
        rp_.freq_scale = 0.5f;
        b.out(rp::rope(c, h, p, rp_));
        b.out(rp::rope_back(c, h, p, rp_));
    }
    b.run_and_compare();
}

TEST(CudaBackend, CopyFillRepeatAndReductions) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * x = b.f32(12, 5, 4, 3);
    rp::Tensor * small = b.f32(12, 1, 4, 1);
    b.out(rp::fill(c, x, 0.25f));
    b.out(rp::cont(c, rp::permute(c, x, 2, 0, 3, 1)));
    rp::Tensor * h16 = rp::cast(c, x, rp::DType::F16);
    b.out(h16, kNmseHalf);
    b.out(rp::cast(c, rp::transpose(c, rp::cast(c, b.f32(9, 11), rp::DType::BF16)), rp::DType::F32), 1e-4);
    b.out(rp::repeat(c, small, x));
    b.out(rp::sum_to(c, x, small));
    b.out(rp::sum_to(c, rp::permute(c, x, 1, 0, 2, 3), b.f32(1, 12, 1, 3)));
    b.out(rp::sum(c, x));
    b.out(rp::mean(c, rp::transpose(c, b.f32(40, 30))));
    b.run_and_compare();
}

TEST(CudaBackend, EmbeddingLookupAndScatterAdd) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * table = b.f32(48, 50);
    rp::Tensor * table16 = b.typed(rp::DType::F16, 48, 50);
    rp::Tensor * tableq = b.typed(rp::DType::Q8_0, 64, 50);
    rp::Tensor * ids = b.ids({3, 7, 3, 49, 0, 7, 7, 12});
    b.out(rp::get_rows(c, table, ids));
    b.out(rp::get_rows(c, table16, ids));
    b.out(rp::get_rows(c, tableq, ids));
    rp::Tensor * dy = b.f32(48, 8);
    b.out(rp::get_rows_back(c, nullptr, dy, ids, table));
    rp::Tensor * acc = b.f32(48, 50);
    b.out(rp::get_rows_back(c, acc, dy, ids, table));
    b.read_back(acc);
    b.run_and_compare();
}

TEST(CudaBackend, MatrixProducts) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * X = b.f32(64, 10, 2);
    rp::Tensor * dY = b.f32(48, 10, 2);
    rp::Tensor * W = b.f32(64, 48);
    rp::Tensor * W16 = b.typed(rp::DType::F16, 64, 48);
    rp::Tensor * Wb16 = b.typed(rp::DType::BF16, 64, 48);
    rp::Tensor * Wq = b.typed(rp::DType::Q8_0, 64, 48);
    b.out(rp::mul_mat(c, W, X));
    b.out(rp::mul_mat(c, W16, X), kNmseHalf);
    b.out(rp::mul_mat(c, Wb16, X), kNmseHalf);
    b.out(rp::mul_mat(c, Wq, X));
    b.out(rp::mul_mat_back_x(c, W, dY, X));
    b.out(rp::mul_mat_back_x(c, W16, dY, X), kNmseHalf);
    b.out(rp::out_prod(c, nullptr, X, dY, W));
    rp::Tensor * acc = b.f32(64, 48);
    b.out(rp::out_prod(c, acc, X, dY, W));
    b.read_back(acc);
    // The accumulating forms (a LoRA branch into W x; an activation's gradient summed by its products), f32 and
    // quantized weights: cuBLAS's beta = 1.
    b.out(rp::mul_mat(c, W, X, rp::scale(c, dY, 1.0f)));
    b.out(rp::mul_mat(c, Wq, X, rp::scale(c, dY, 0.5f)));
    b.out(rp::mul_mat_back_x(c, W, dY, X, rp::scale(c, X, 1.0f)));
    b.out(rp::mul_mat_back_x(c, Wq, dY, X, rp::scale(c, X, 2.0f)));
    b.run_and_compare();
}

TEST(CudaBackend, AttentionForwardBackward) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * q = b.f32(64, 4, 37, 2);
    rp::Tensor * k = b.f32(64, 2, 41, 2);
    rp::Tensor * v = b.f32(64, 2, 41, 2);
    rp::Tensor * o = rp::attention(c, q, k, v, 0.125f);
    b.out(o);
    b.out(rp::attention_lse(c, o));
    const rp::AttentionGrads gr = rp::attention_back(c, o, b.f32(64, 4, 37, 2));
    b.out(gr.dq);
    b.out(gr.dk);
    b.out(gr.dv);
    b.run_and_compare();
}

// Batched decoding's keys: windows of a KV cache of 3 sequences ([D, Hkv, 57, 3], each sequence's first 41 rows) read
// in place by the f32 kernel (and copied for the rounded one).
TEST(CudaBackend, AttentionReadsKvCacheWindowsInPlace) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    rp::Tensor * q = b.f32(64, 4, 2, 3);
    rp::Tensor * kc = b.f32(64, 2, 57, 3);
    rp::Tensor * vc = b.f32(64, 2, 57, 3);
    const int64_t ne[4] = {64, 2, 41, 3};
    const size_t nb[4] = {kc->nb[0], kc->nb[1], kc->nb[2], kc->nb[3]};
    rp::Tensor * kw = rp::view(c, kc, ne, nb, 0);
    rp::Tensor * vw = rp::view(c, vc, ne, nb, 0);
    rp::Tensor * o = rp::attention(c, q, kw, vw, 0.125f);
    ASSERT_EQ(o->src[1], kw);
    b.out(o);
    b.out(rp::attention(c, q, kw, vw, 0.125f, rp::DType::BF16), kNmseHalf);
    b.run_and_compare();
}

// f16 attention (the accelerated type of f32 inputs) with gradients at real loss scales: dout of ~1e-7 (a
// mean over thousands of tokens), most of it below f16's normal range and much of it below its smallest
// subnormal. The backward scales dout by a power of two before rounding (half_scale.h): dq, dk, dv keep
// f16's precision, as at dout ~ 1 (without the scale they came out mostly zero).
TEST(CudaBackend, F16AttentionGradientsAtRealLossScales) {
    RP_REQUIRE_GPU();
    for (float mag : {1.0f, 1e-7f, 3e-9f}) {
        SCOPED_TRACE("dout magnitude " + std::to_string(mag));
        Bench b;
        auto & c = b.ctx;
        rp::Tensor * q = b.f32(64, 4, 37, 2);
        rp::Tensor * k = b.f32(64, 2, 41, 2);
        rp::Tensor * v = b.f32(64, 2, 41, 2, -3.0f, 3.0f);
        rp::Tensor * o = rp::attention(c, q, k, v, 0.125f, rp::DType::F16);
        const rp::AttentionGrads gr = rp::attention_back(c, o, b.f32(64, 4, 37, 2, -mag, mag));
        b.out(gr.dq, kNmseHalf);
        b.out(gr.dk, kNmseHalf);
        b.out(gr.dv, kNmseHalf);
        b.run_and_compare();
    }
}

// Packed sequences: attention with a first visible key per query (document masking), forward and backward.
TEST(CudaBackend, PackedAttentionDocumentMasking) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    const int64_t T = 150;
    std::vector<int32_t> ks;
    for (int64_t seq = 0; seq < 2; ++seq)
        for (int64_t t = 0; t < T; ++t) ks.push_back(static_cast<int32_t>(t < 7 ? 0 : t < 90 ? 7 : t < 91 ? 90 : 91));
    rp::Tensor * q = b.f32(64, 4, T, 2);
    rp::Tensor * k = b.f32(64, 2, T, 2);
    rp::Tensor * v = b.f32(64, 2, T, 2);
    rp::Tensor * o = rp::attention(c, q, k, v, 0.125f, rp::DType::F32, b.ids(ks));
    b.out(o);
    const rp::AttentionGrads gr = rp::attention_back(c, o, b.f32(64, 4, T, 2));
    b.out(gr.dq);
    b.out(gr.dk);
    b.out(gr.dv);
    b.run_and_compare();
}

// Gated DeltaNet (qwen35): the short convolution (with a conv state, and over packed examples) and its gradients,
// the delta rule over 150 tokens in chunks of 64 (two value heads per key head, a 128-wide key head: four elements
// a lane) with an initial state, its final state and every gradient; the packed form; the L2 norm, sigmoid and
// softplus of the layer.
TEST(CudaBackend, GatedDeltaNetOps) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    const int64_t T = 150, B = 2, C = 96, K = 4;
    std::vector<int32_t> seg;
    for (int64_t s = 0; s < B; ++s)
        for (int64_t t = 0; t < T; ++t) seg.push_back(static_cast<int32_t>(t < 70 ? 0 : t < 71 ? 70 : 71));
    rp::Tensor * x = b.f32(C, T, B);
    rp::Tensor * w = b.f32(K, C);
    rp::Tensor * y = rp::ssm_conv(c, x, w, b.f32(C, K - 1, B));
    b.out(y);
    b.out(rp::ssm_conv_state(c, y));
    rp::Tensor * yp = rp::ssm_conv(c, x, w, nullptr, b.ids(seg));
    b.out(yp);
    rp::Tensor * dy = b.f32(C, T, B);
    for (int which : {0, 1}) {
        b.out(rp::ssm_conv_back(c, y, dy, which));
        b.out(rp::ssm_conv_back(c, yp, dy, which));
    }
    const int64_t Dk = 128, Hk = 2, Dv = 64, Hv = 4;
    rp::Tensor * q = rp::l2_norm(c, b.f32(Dk, Hk, T, B), 1e-6f);
    rp::Tensor * k = rp::l2_norm(c, b.f32(Dk, Hk, T, B), 1e-6f);
    rp::Tensor * v = b.f32(Dv, Hv, T, B);
    rp::Tensor * g = rp::scale(c, rp::softplus(c, b.f32(Hv, T, B)), -0.5f);
    rp::Tensor * beta = rp::sigmoid(c, b.f32(Hv, T, B));
    rp::Tensor * o = rp::delta_net(c, q, k, v, g, beta, 0.088f, b.f32(Dk, Dv, Hv, B));
    b.out(q);
    b.out(rp::l2_norm_back(c, q, b.f32(Dk, Hk, T, B)));   // from q's output and the scales its forward saved
    b.out(g);
    b.out(beta);
    b.out(o);
    b.out(rp::delta_net_state(c, o));
    const rp::DeltaNetGrads gr = rp::delta_net_back(c, o, b.f32(Dv, Hv, T, B));
    for (rp::Tensor * t : {gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, gr.dstate0}) b.out(t);
    rp::Tensor * op = rp::delta_net(c, q, k, v, g, beta, 0.088f, nullptr, b.ids(seg), 32);
    b.out(op);
    const rp::DeltaNetGrads gp = rp::delta_net_back(c, op, b.f32(Dv, Hv, T, B));
    for (rp::Tensor * t : {gp.dq, gp.dk, gp.dv, gp.dg, gp.dbeta}) b.out(t);
    b.run_and_compare();
}

// Mixture of experts: routing on the device (top-k, weights and their backward), the grouped expert matmul
// with f32 and Q8_0 experts, its input and weight gradients (shared and per-slot inputs).
TEST(CudaBackend, MixtureOfExpertsOps) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    const int64_t E = 8, K = 64, N = 48, T = 37, k = 2;
    rp::Tensor * logits = b.f32(E, T, 1, 1, -3, 3);
    rp::Tensor * ids = rp::moe_topk(c, logits, static_cast<int32_t>(k));
    b.out(rp::moe_weights(c, logits, ids, true));
    b.out(rp::moe_weights_back(c, logits, ids, b.f32(k, T), rp::MoeParams{static_cast<int32_t>(k), true, 0.0f, 0.3f}));
    rp::Tensor * W = b.f32(K, N, E);
    rp::Tensor * Wq = c.new_tensor(rp::DType::Q8_0, K, N, E);
    c.alloc_data(Wq);
    rp::tensor_set_f32(Wq, rand_vec(size_t(Wq->nelements()), b.rng));
    rp::Tensor * X = b.f32(K, 1, T);
    rp::Tensor * Xs = b.f32(K, k, T);
    rp::Tensor * dY = b.f32(N, k, T);
    b.out(rp::mul_mat_id(c, W, X, ids));
    b.out(rp::mul_mat_id(c, Wq, Xs, ids));
    b.out(rp::mul_mat_id_back_x(c, W, dY, ids, X));
    b.out(rp::mul_mat_id_back_x(c, Wq, dY, ids, Xs));
    b.out(rp::out_prod_id(c, nullptr, X, dY, ids, W));
    rp::Tensor * acc = b.f32(K, N, E);
    b.out(rp::out_prod_id(c, acc, Xs, dY, ids, W));
    b.read_back(acc);
    b.run_and_compare();
}

TEST(CudaBackend, LmHeadCrossEntropy) {
    RP_REQUIRE_GPU();
    for (bool fill_seed : {true, false}) {
        SCOPED_TRACE(fill_seed ? "dloss = fill" : "dloss read from the device");
        Bench b;
        auto & c = b.ctx;
        rp::Tensor * h = b.f32(32, 9);
        rp::Tensor * W = b.f32(32, 50);
        rp::Tensor * labels = b.ids({4, -1, 49, 0, 17, 17, 3, -1, 30});
        rp::Tensor * ce = rp::lm_head_ce(c, h, W, labels, 1.0f / 7, 16);
        b.out(ce);
        rp::Tensor * dloss = fill_seed ? rp::fill(c, ce, 1.0f) : rp::scale(c, rp::fill(c, ce, 1.0f), 2.5f);
        rp::Tensor * dW = b.f32(32, 50);
        b.out(rp::lm_head_ce_back(c, ce, dloss, dW));
        b.read_back(dW);
        b.run_and_compare();
    }
}

// The sequence-level head of preference training: per-token NLL (forward, and its backward with a per-token
// dloss read on the device), per-answer sums and every preference loss with its backward.
TEST(CudaBackend, PerTokenHeadAndPreferenceLoss) {
    RP_REQUIRE_GPU();
    for (rp::PreferenceMethod m : {rp::PreferenceMethod::Dpo, rp::PreferenceMethod::Ipo, rp::PreferenceMethod::Simpo, rp::PreferenceMethod::Orpo,
                                   rp::PreferenceMethod::Kto}) {
        SCOPED_TRACE("method " + std::to_string(static_cast<int>(m)));
        Bench b;
        auto & c = b.ctx;
        const int64_t T = 5, B = 4;
        rp::Tensor * h = b.f32(32, T * B);
        rp::Tensor * W = b.f32(32, 50);
        rp::Tensor * labels = b.ids({-1, 4, 49, 0, 17,  -1, -1, 3, 30, 30,  1, 2, 3, 4, 5,  -1, 9, -1, 8, 7});
        rp::Tensor * nll = rp::lm_head_token_nll(c, h, W, labels, 16);
        b.out(nll);
        rp::Tensor * per_seq = rp::sum_to(c, rp::reshape(c, nll, T, B), c.new_tensor(rp::DType::F32, 1, B));
        rp::Tensor * lp = rp::scale(c, rp::reshape(c, per_seq, B), -1.0f);
        rp::Tensor * seq = b.f32(4, B, 1, 1, 1.0f, 4.0f);
        rp::PreferenceParams p;
        p.method = m;
        p.beta = m == rp::PreferenceMethod::Simpo ? 2.0 : 0.5;
        rp::Tensor * loss = rp::preference_loss(c, lp, seq, p, 0.5f);
        b.out(loss);
        rp::Tensor * dlp = rp::preference_loss_back(c, loss, rp::fill(c, loss, 1.0f));
        b.out(dlp);
        rp::Tensor * dW = b.f32(32, 50);
        b.out(rp::lm_head_ce_back(c, nll, rp::repeat(c, rp::reshape(c, rp::scale(c, dlp, -1.0f), 1, B), c.new_tensor(rp::DType::F32, T, B)), dW));
        b.read_back(dW);
        b.run_and_compare();
    }
}

// Packed preference micro-batches: the per-token NLL summed by answer slot (segment_sum: the one-column scatter-add)
// into 8 slots, two of them empty, the loss over the slots and the gather of its gradient back to the tokens.
TEST(CudaBackend, PackedAnswerSlotsAndTheirGradients) {
    RP_REQUIRE_GPU();
    for (rp::PreferenceMethod m : {rp::PreferenceMethod::Dpo, rp::PreferenceMethod::Kto}) {
        SCOPED_TRACE("method " + std::to_string(static_cast<int>(m)));
        Bench b;
        auto & c = b.ctx;
        const int64_t T = 10, B = 2, D = 4;
        rp::Tensor * h = b.f32(32, T * B);
        rp::Tensor * W = b.f32(32, 50);
        rp::Tensor * labels = b.ids({-1, 4, 49, -1, 17, 3, -1, 3, 30, -1,  -1, 2, 3, 4, -1, 8, 7, -1, -1, -1});
        rp::Tensor * slots = b.ids({0, 0, 0, 1, 1, 1, 2, 2, 3, 3,  4, 4, 4, 4, 5, 5, 5, 7, 7, 7});
        rp::Tensor * nll = rp::lm_head_token_nll(c, h, W, labels, 16);
        rp::Tensor * lp = rp::scale(c, rp::segment_sum(c, nll, slots, B * D), -1.0f);
        b.out(lp);
        // per slot: reference, tokens, NLL weight, kind (slots 6 and 7 empty: 0 tokens)
        rp::Tensor * seq = b.f32(4, B * D, 1, 1, 1.0f, 4.0f);
        std::vector<float> sv = rp::tensor_get_f32(seq);
        const float kinds[] = {1, 0, -1, 0, 1, 0, 0, 0};
        for (int64_t k = 0; k < B * D; ++k) {
            sv[size_t(4 * k + rp::kKind)] = m == rp::PreferenceMethod::Kto ? kinds[k] : 0.0f;
            if (k >= 6) sv[size_t(4 * k + rp::kAnswerTokens)] = 0.0f;
        }
        rp::tensor_set_f32(seq, sv);
        rp::PreferenceParams p;
        p.method = m;
        p.beta = 0.5;
        rp::Tensor * loss = rp::preference_loss(c, lp, seq, p, 1.0f / 3.0f);
        b.out(loss);
        rp::Tensor * dlp = rp::preference_loss_back(c, loss, rp::fill(c, loss, 1.0f));
        b.out(dlp);
        rp::Tensor * dtok = rp::get_rows(c, rp::reshape(c, rp::scale(c, dlp, -1.0f), 1, B * D), slots);
        b.out(dtok);
        rp::Tensor * dW = b.f32(32, 50);
        b.out(rp::lm_head_ce_back(c, nll, rp::reshape(c, dtok, T * B), dW));
        b.read_back(dW);
        b.run_and_compare();
    }
}

// GRPO's policy loss on the per-token head: the loss (a tree sum on the device, token order on the CPU), each token's
// derivative and the head's weight gradient, off-policy with clipping and the KL term, and on-policy.
TEST(CudaBackend, GrpoLossOnThePerTokenHead) {
    RP_REQUIRE_GPU();
    for (const bool on_policy : {false, true}) {
        SCOPED_TRACE(on_policy ? "on-policy" : "off-policy");
        Bench b;
        auto & c = b.ctx;
        const int64_t N = 600;  // more tokens than the sum's block has threads
        rp::Tensor * h = b.f32(32, N);
        rp::Tensor * W = b.f32(32, 50);
        std::vector<int32_t> lab(static_cast<size_t>(N));
        for (size_t i = 0; i < lab.size(); ++i) lab[i] = i % 9 == 0 ? -1 : static_cast<int32_t>((i * 13) % 50);
        rp::Tensor * labels = b.ids(lab);
        rp::Tensor * nll = rp::lm_head_token_nll(c, h, W, labels, 64);
        rp::Tensor * logp = rp::scale(c, nll, -1.0f);
        rp::Tensor * values = b.f32(rp::kTokenValues, N, 1, 1, -1.0f, 1.0f);
        std::vector<float> v = rp::tensor_get_f32(values);
        for (int64_t t = 0; t < N; ++t) {
            v[size_t(rp::kTokenValues * t + rp::kOldLogp)] -= 4.0f;  // log-probabilities near those of a 50-token vocabulary
            v[size_t(rp::kTokenValues * t + rp::kRefLogp)] -= 4.0f;
            v[size_t(rp::kTokenValues * t + rp::kTokenWeight)] = lab[size_t(t)] < 0 ? 0.0f : 1.0f / 500.0f;
        }
        rp::tensor_set_f32(values, v);
        rp::GrpoParams p;
        p.epsilon_high = 0.28;
        p.beta = 0.04;
        p.on_policy = on_policy;
        rp::Tensor * loss = rp::grpo_loss(c, logp, values, p);
        b.out(loss);
        rp::Tensor * d = rp::grpo_loss_back(c, loss, rp::fill(c, loss, 1.0f));
        b.out(d);
        rp::Tensor * dW = b.f32(32, 50);
        b.out(rp::lm_head_ce_back(c, nll, rp::scale(c, d, -1.0f), dW));
        b.read_back(dW);
        b.run_and_compare();
    }
}

// A small training step built by autodiff (rms_norm, GEMMs, swiglu, LM head + CE): the loss and every
// accumulated gradient, as the finetuning graphs use the backend.
TEST(CudaBackend, AutodiffTrainingGraph) {
    RP_REQUIRE_GPU();
    Bench b;
    auto & c = b.ctx;
    const int64_t C = 32, F = 48, V = 40, T = 12;
    rp::Tensor * x = b.f32(C, T);
    rp::Tensor * wn = b.f32(C, 1, 1, 1, 0.5f, 1.5f);
    rp::Tensor * Wg = b.f32(C, F);
    rp::Tensor * Wu = b.f32(C, F);
    rp::Tensor * Wd = b.f32(F, C);
    rp::Tensor * Wo = b.f32(C, V);
    std::vector<int32_t> lab(static_cast<size_t>(T));
    for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<int32_t>((i * 7) % V);
    lab[3] = -1;
    rp::Tensor * labels = b.ids(lab);
    std::vector<rp::Tensor *> params = {wn, Wg, Wu, Wd, Wo};
    for (rp::Tensor * p : params) {
        rp::Tensor * g = rp::set_param(c, p)->grad;  // set_param returns the param; its gradient leaf has no data yet
        c.alloc_data(g);
        rp::tensor_set_f32(g, std::vector<float>(size_t(g->nelements()), 0.0f));
        b.read_back(g);
    }
    rp::Tensor * hn = rp::rms_norm(c, x, wn, 1e-6f);
    rp::Tensor * act = rp::swiglu(c, rp::mul_mat(c, Wg, hn), rp::mul_mat(c, Wu, hn));
    rp::Tensor * hid = rp::add(c, x, rp::mul_mat(c, Wd, act));
    rp::Tensor * loss = rp::lm_head_ce(c, hid, Wo, labels, 1.0f / (T - 1), 16);
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::build_backward(c, g, loss, params);
    b.out(loss);
    b.check(b.run(g, true));
}

TEST(CudaBackend, MemoryComesFromTheDeviceArena) {
    RP_REQUIRE_GPU();
    rp::Context c;
    rp::Tensor * x = c.new_tensor(rp::DType::F32, 1 << 16, 4);
    rp::Tensor * y = rp::silu(c, rp::scale(c, x, 2.0f));
    y->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, y);
    rp::CudaDeviceOptions o;
    o.memory_bytes = size_t(4) << 20;
    rp::CudaDevice dev(0, o);
    {
        rp::CudaBackend be(dev);
        const size_t peak = be.allocate(g);
        EXPECT_EQ(peak, size_t(2) * (size_t(1) << 18) * 4);  // scale's and silu's outputs, 1 MiB each
        EXPECT_EQ(be.buffer_size(), peak);
        EXPECT_EQ(dev.used(), peak + be.workspace_size());
        EXPECT_EQ(dev.high_water(), dev.used());
    }
    EXPECT_EQ(dev.used(), 0u);  // the destructor gave it back
    // A graph that does not fit the device's cap fails with the arena's message.
    rp::Tensor * big = c.new_tensor(rp::DType::F32, 1 << 20, 2);
    rp::Tensor * z = rp::silu(c, big);
    rp::Graph g2;
    rp::build_forward(g2, z);
    rp::CudaBackend be(dev);
    try {
        be.allocate(g2);
        FAIL() << "an 8 MiB graph fit in a 4 MiB device";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("graph buffer"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
}

TEST(CudaBackend, BadIdsHostLeafsAndUnsupportedNodesAreReportedByName) {
    RP_REQUIRE_GPU();
    rp::CudaDeviceOptions o;
    o.memory_bytes = size_t(16) << 20;
    rp::CudaDevice dev(0, o);
    rp::Stream & s = dev.stream(rp::StreamKind::Compute);
    rp::Context c;
    rp::Tensor * table = c.new_tensor(rp::DType::F32, 16, 10);
    rp::Tensor * ids = c.new_tensor(rp::DType::I32, 3);
    rp::Tensor * rows = rp::get_rows(c, table, ids);
    rows->name = "embedding";
    rows->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, rows);

    // Leafs on the host are refused before anything runs.
    std::vector<float> host_table(160, 1.0f);
    std::vector<int32_t> host_ids = {1, 2, 3};
    table->data = host_table.data();
    ids->data = host_ids.data();
    rp::CudaBackend be(dev);
    be.allocate(g);
    try {
        be.compute(g, s);
        FAIL() << "a host leaf was accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("host pointer"), std::string::npos) << e.what();
    }

    // An id past the table: the kernel skips it, check() names the node after the sync.
    table->data = dev.allocate(160 * 4, "table");
    ids->data = dev.allocate(3 * 4, "ids");
    const int32_t bad[3] = {1, 10, 2};
    s.copy(table->data, host_table.data(), 160 * 4, rp::CopyKind::HostToDevice);
    s.copy(ids->data, bad, sizeof bad, rp::CopyKind::HostToDevice);
    s.synchronize();
    be.compute(g, s);
    s.synchronize();
    try {
        be.check();
        FAIL() << "the out-of-range id went unnoticed";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(be.check());  // the flags were cleared
    // With good ids nothing is reported.
    s.copy(ids->data, host_ids.data(), 12, rp::CopyKind::HostToDevice);
    be.compute(g, s);
    s.synchronize();
    EXPECT_NO_THROW(be.check());

    // A node without a CUDA path is refused by name before anything is enqueued.
    rows->op = rp::Op::COUNT;
    try {
        be.compute(g, s);
        FAIL() << "a node without a CUDA kernel was accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("no CUDA kernel"), std::string::npos) << e.what();
    }
    rows->op = rp::Op::GET_ROWS;
    s.synchronize();
    dev.free(table->data);
    dev.free(ids->data);
    table->data = nullptr;
    ids->data = nullptr;
}

#else

TEST(CudaBackend, NeedsACudaBuild) { GTEST_SKIP() << "skipped: built without CUDA (RP_CUDA=OFF or no nvcc)"; }

#endif
