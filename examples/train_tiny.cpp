// train_tiny: the smallest complete training loop with ggml-rp.
//
// A 2-layer MLP  y = W2 · silu(W1 · x + b1) + b2  learns y = sin(x0) + x1·x2 from 256 random points.
// Shows the whole workflow: record a lazy graph, let build_backward append the gradient nodes, allocate
// once, then per step: zero the gradients, compute (forward + backward), update the weights (plain SGD).
#include "ggml_rp/ggml_rp.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
    const int64_t n_in = 3, n_hidden = 32, n_points = 256;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

    rp::Context ctx;  // owns every tensor struct below (and the host memory we ask it for)
    auto leaf = [&](const char * name, int64_t ne0, int64_t ne1, float init_scale) {
        rp::Tensor * t = rp::set_name(ctx.new_tensor(rp::DType::F32, ne0, ne1), name);
        ctx.alloc_data(t);
        std::vector<float> v(static_cast<size_t>(t->nelements()));
        for (float & x : v) x = init_scale * uni(rng);
        rp::tensor_set_f32(t, v);
        return t;
    };

    // Data: x [n_in, n_points] (one column per sample), target [1, n_points].
    rp::Tensor * x = leaf("x", n_in, n_points, 1.0f);
    rp::Tensor * target = leaf("target", 1, n_points, 0.0f);
    {
        const std::vector<float> xv = rp::tensor_get_f32(x);
        std::vector<float> tv(n_points);
        for (int64_t i = 0; i < n_points; ++i)
            tv[i] = std::sin(xv[i * n_in + 0]) + xv[i * n_in + 1] * xv[i * n_in + 2];
        rp::tensor_set_f32(target, tv);
    }

    // Parameters. Weights are [in, out] (mul_mat orientation: W[in, out] x X[in, T] -> Y[out, T]).
    rp::Tensor * W1 = leaf("W1", n_in, n_hidden, 1.0f);
    rp::Tensor * b1 = leaf("b1", n_hidden, 1, 0.1f);
    rp::Tensor * W2 = leaf("W2", n_hidden, 1, 0.3f);
    rp::Tensor * b2 = leaf("b2", 1, 1, 0.0f);
    const std::vector<rp::Tensor *> params = {W1, b1, W2, b2};
    for (rp::Tensor * p : params) {
        rp::set_param(ctx, p);   // creates p->grad (f32, same shape)...
        ctx.alloc_data(p->grad); // ...whose memory we own
    }

    // Forward graph: nothing is computed here, ops only record nodes.
    rp::Tensor * h = rp::silu(ctx, rp::add(ctx, rp::mul_mat(ctx, W1, x), b1));  // b1 broadcast over samples
    rp::Tensor * y = rp::add(ctx, rp::mul_mat(ctx, W2, h), b2);
    rp::Tensor * diff = rp::add(ctx, y, rp::scale(ctx, target, -1.0f));
    rp::Tensor * loss = rp::mean(ctx, rp::mul(ctx, diff, diff));                  // mean squared error

    rp::Graph graph;
    rp::build_forward(graph, loss);
    rp::build_backward(ctx, graph, loss, params);  // appends nodes that ADD dloss/dp into p->grad

    rp::CpuBackend backend;
    const size_t bytes = backend.allocate(graph);  // one buffer for all nodes, reused by liveness
    std::printf("graph: %zu nodes, compute buffer %zu bytes\n", graph.nodes.size(), bytes);

    const float lr = 0.1f;
    for (int step = 0; step <= 300; ++step) {
        for (rp::Tensor * p : params) rp::tensor_set_f32(p->grad, std::vector<float>(p->nelements(), 0.0f));
        backend.compute(graph, /*n_threads=*/2);
        if (step % 30 == 0) std::printf("step %3d  loss %.6f\n", step, rp::tensor_get_f32(loss)[0]);
        for (rp::Tensor * p : params) {  // SGD: p -= lr * grad
            std::vector<float> w = rp::tensor_get_f32(p);
            const std::vector<float> g = rp::tensor_get_f32(p->grad);
            for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
            rp::tensor_set_f32(p, w);
        }
    }
    return 0;
}
