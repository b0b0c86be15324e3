// The op test harness: builds an op's graph from random leaf inputs, runs forward + backward on the CPU
// backend with 1 and 2 threads, and checks
//   - determinism: output and gradient bits equal for both thread counts;
//   - forward: against the op's naive double reference (max-norm relative error);
//   - backward: loss = sum(R * out) for a random R; every differentiable input's gradient (from our float
//     backward, accumulated into a zeroed param grad) against central finite differences of the DOUBLE
//     reference, as the max-norm relative error max|a - b| / max(max|b|, 1e-6) < 1e-3.
// The errors are printed per op. Kernels run their parallel partition even for tiny tensors.
#pragma once

#include "ggml_rp/ggml_rp.h"
#include "reference.h"

#include <array>
#include <functional>
#include <string>
#include <vector>

namespace optest {

struct Input {
    std::string name;
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    rp::DType type = rp::DType::F32;
    bool diff = true;              // a param: its gradient is checked
    std::vector<int32_t> ints{};   // values of an i32 input (ids, positions, labels)
    float lo = -1.0f, hi = 1.0f;   // range of random float values

    Input(std::string n, std::array<int64_t, 4> shape, rp::DType t = rp::DType::F32, bool d = true)
        : name(std::move(n)), ne(shape), type(t), diff(d) {}
};

// Values of the inputs for the reference: floats as stored (after f16/bf16/quantization round trips),
// i32 inputs as doubles. In the leaf's own logical order (i0 fastest).
using RefInputs = std::vector<ref::DT>;

struct Case {
    std::string name;
    std::vector<Input> inputs;
    std::function<rp::Tensor *(rp::Context &, const std::vector<rp::Tensor *> &)> build;
    std::function<ref::DT(const RefInputs &)> reference;
    double fwd_tol = 1e-5;
    double grad_tol = 1e-3;
    uint32_t seed = 1;
};

struct Report {
    double fwd_err = 0.0;
    double max_grad_err = 0.0;
};

// Runs every check with gtest assertions (EXPECT_*), prints the errors, returns them.
Report check_op(const Case & c);

// max|a - b| / max(max|b|, floor)
double rel_err(const std::vector<float> & a, const std::vector<double> & b, double floor = 1e-6);

std::vector<int32_t> ints_from(const ref::DT & d);

// The forward graph that ends in `out` (leafs with data), computed by the CPU backend on one thread: the values
// of `out`; and the rp::Error message computing it throws ("" when it throws none).
std::vector<float> compute(rp::Tensor * out);
std::string compute_error(rp::Tensor * out);

} // namespace optest
