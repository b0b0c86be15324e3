#include "harness.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/kernel_scratch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace optest {

double rel_err(const std::vector<float> & a, const std::vector<double> & b, double floor) {
    double num = 0.0, den = floor;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    if (a.size() != b.size()) return INFINITY;
    return num / den;
}

std::vector<float> compute(rp::Tensor * out) {
    out->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, out);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    return rp::tensor_get_f32(out);
}

std::string compute_error(rp::Tensor * out) {
    try {
        compute(out);
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

std::vector<int32_t> ints_from(const ref::DT & d) {
    std::vector<int32_t> v;
    for (double x : d.v) v.push_back(static_cast<int32_t>(x));
    return v;
}

namespace {

struct RunOut {
    std::vector<float> out;
    std::vector<std::vector<float>> grads;  // per input (empty when not diff)
};

// Leaf values as generated (before storage rounding).
struct Values {
    std::vector<std::vector<float>> f;          // per input
    std::vector<std::vector<uint8_t>> bytes;    // per input: raw blocks of types we cannot quantize (K-quants)
    std::vector<float> r;                       // R
};

// Byte offsets of the f16 scale fields (d, dmin) in one block of each K-quant (formats.md §2.4).
std::vector<size_t> scale_fields(rp::DType t) {
    switch (t) {
    case rp::DType::Q2_K: return {80, 82};
    case rp::DType::Q3_K: return {108};
    case rp::DType::Q4_K: case rp::DType::Q5_K: return {0, 2};
    case rp::DType::Q6_K: return {208};
    default: return {};
    }
}

// Random blocks with sane scales: random quants and sub-block scales, d and dmin in [0.002, 0.02].
std::vector<uint8_t> random_blocks(const Input & in, std::mt19937 & rng) {
    const size_t n = rp::dtype_row_bytes(in.type, in.ne[0]) * static_cast<size_t>(in.ne[1] * in.ne[2] * in.ne[3]);
    std::vector<uint8_t> b(n);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t & x : b) x = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> d(0.002f, 0.02f);
    const size_t bs = rp::dtype_type_size(in.type);
    for (size_t off = 0; off < n; off += bs)
        for (size_t f : scale_fields(in.type)) {
            const uint16_t h = rp::fp32_to_fp16(d(rng));
            std::memcpy(&b[off + f], &h, 2);
        }
    return b;
}

RunOut run_graph(const Case & c, const Values & vals, int n_threads, RefInputs * stored) {
    rp::Context ctx;
    std::vector<rp::Tensor *> leaves;
    std::vector<rp::Tensor *> params;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
        const Input & in = c.inputs[i];
        rp::Tensor * t = ctx.new_tensor(in.type, in.ne[0], in.ne[1], in.ne[2], in.ne[3]);
        t->name = in.name;
        t->flags |= rp::kFlagInput;
        ctx.alloc_data(t);
        if (in.type == rp::DType::I32) rp::tensor_set_i32(t, in.ints);
        else if (!vals.bytes[i].empty()) std::memcpy(t->data, vals.bytes[i].data(), vals.bytes[i].size());
        else rp::tensor_set_f32(t, vals.f[i]);
        if (in.diff) {
            rp::set_param(ctx, t);
            ctx.alloc_data(t->grad);
            params.push_back(t);
        }
        if (stored) {
            ref::DT d(in.ne);
            if (in.type == rp::DType::I32) {
                for (size_t k = 0; k < in.ints.size(); ++k) d.v[k] = in.ints[k];
            } else {
                const std::vector<float> back = rp::tensor_get_f32(t);
                for (size_t k = 0; k < back.size(); ++k) d.v[k] = back[k];
            }
            stored->push_back(std::move(d));
        }
        leaves.push_back(t);
    }
    rp::Tensor * out = c.build(ctx, leaves);
    out->flags |= rp::kFlagOutput;
    rp::Tensor * R = ctx.new_tensor(rp::DType::F32, out->ne[0], out->ne[1], out->ne[2], out->ne[3]);
    R->name = std::string(1, 'R');  // (not = "R": GCC 12 warns falsely, -Wrestrict)
    ctx.alloc_data(R);
    rp::tensor_set_f32(R, vals.r);
    rp::Tensor * loss = rp::sum(ctx, rp::mul(ctx, out, R));
    rp::Graph g;
    rp::build_forward(g, loss);
    if (!params.empty()) rp::build_backward(ctx, g, loss, params);
    rp::CpuBackend be;
    be.allocate(g);
    const int64_t unplanned = rp::cpu::unplanned_scratch_calls();
    be.compute(g, n_threads);
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), unplanned) << c.name << ": a kernel asked more scratch than its node's plan holds";
    RunOut r;
    r.out = rp::tensor_get_f32(out);
    for (size_t i = 0; i < c.inputs.size(); ++i)
        r.grads.push_back(c.inputs[i].diff ? rp::tensor_get_f32(leaves[i]->grad) : std::vector<float>{});
    return r;
}

std::string sci(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2e", v);
    return buf;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

} // namespace

Report check_op(const Case & c) {
    // Every kernel takes its parallel path however small the test tensors are.
    struct ParallelAlways {
        ParallelAlways() { rp::cpu::set_min_parallel_elements(0); }
        ~ParallelAlways() { rp::cpu::set_min_parallel_elements(16384); }
    } parallel_always;
    std::mt19937 rng(c.seed);
    Values vals;
    for (const Input & in : c.inputs) {
        std::uniform_real_distribution<float> u(in.lo, in.hi);
        std::vector<float> v(static_cast<size_t>(in.ne[0] * in.ne[1] * in.ne[2] * in.ne[3]));
        if (in.type != rp::DType::I32)
            for (float & x : v) x = u(rng);
        vals.f.push_back(std::move(v));
        vals.bytes.push_back(in.type != rp::DType::I32 && !rp::can_quantize(in.type) ? random_blocks(in, rng)
                                                                                    : std::vector<uint8_t>{});
    }

    {
        // R has the output's shape: record the op once (no data needed) to learn it.
        rp::Context ctx;
        std::vector<rp::Tensor *> leaves;
        for (const Input & in : c.inputs) leaves.push_back(ctx.new_tensor(in.type, in.ne[0], in.ne[1], in.ne[2], in.ne[3]));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        vals.r.resize(static_cast<size_t>(c.build(ctx, leaves)->nelements()));
        for (float & x : vals.r) x = u(rng);
    }
    RefInputs stored;
    const RunOut a = run_graph(c, vals, 1, &stored);
    const RunOut b = run_graph(c, vals, 2, nullptr);

    Report rep;
    // Determinism across thread counts.
    EXPECT_TRUE(same_bits(a.out, b.out)) << c.name << ": forward differs between 1 and 2 threads";
    for (size_t i = 0; i < c.inputs.size(); ++i)
        EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << c.name << ": gradient of " << c.inputs[i].name
                                                       << " differs between 1 and 2 threads";

    // Forward against the double reference.
    const ref::DT y = c.reference(stored);
    EXPECT_EQ(static_cast<size_t>(y.size()), a.out.size()) << c.name << ": reference output size";
    rep.fwd_err = rel_err(a.out, y.v);
    EXPECT_LT(rep.fwd_err, c.fwd_tol) << c.name << ": forward vs double reference";

    // Backward against central differences of L = sum(R * ref(x)) in double.
    auto loss_of = [&](const RefInputs & in) {
        const ref::DT o = c.reference(in);
        double L = 0.0;
        for (size_t k = 0; k < o.v.size(); ++k) L += static_cast<double>(vals.r[k]) * o.v[k];
        return L;
    };
    std::string line = "[ op ] ";
    line += c.name;
    line += ": fwd ";
    line += sci(rep.fwd_err);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
        if (!c.inputs[i].diff) continue;
        RefInputs x = stored;
        std::vector<double> fd(x[i].v.size());
        for (size_t k = 0; k < fd.size(); ++k) {
            const double x0 = x[i].v[k];
            const double h = 1e-4 * std::max(1.0, std::fabs(x0));
            x[i].v[k] = x0 + h;
            const double lp = loss_of(x);
            x[i].v[k] = x0 - h;
            const double lm = loss_of(x);
            x[i].v[k] = x0;
            fd[k] = (lp - lm) / (2 * h);
        }
        const double e = rel_err(a.grads[i], fd);
        rep.max_grad_err = std::max(rep.max_grad_err, e);
        EXPECT_LT(e, c.grad_tol) << c.name << ": gradient of " << c.inputs[i].name << " vs finite differences";
        line += ", d";
        line += c.inputs[i].name;
        line += ' ';
        line += sci(e);
    }
    std::printf("%s\n", line.c_str());
    return rep;
}

} // namespace optest
