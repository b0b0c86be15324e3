// MUL_MAT, MUL_MAT_BACK_X and OUT_PROD: the batch and broadcast loops of ops/node_args.h around the GEMM
// kernels of gemm.h (which are parallel and deterministic inside); batches that are columns after each other run as
// one product (node_args.h for_each_gemm_batch). Orientation: see ggml_rp/ops/mul_mat.h.
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/ops/node_args.h"

namespace rp::cpu {

void mul_mat(Tensor * n) {
    node::for_each_gemm_batch(n, [&](const node::MatmulArgs & a) {
        matmul_fwd(a.K, a.N, a.T, a.w, n->src[0]->type, a.w_row, a.x, a.ldx, a.out, a.ld_out, a.accumulate);
    }, true);
}

void mul_mat_back_x(Tensor * n) {
    node::for_each_gemm_batch(n, [&](const node::MatmulArgs & a) {
        matmul_bwd_x(a.K, a.N, a.T, a.w, n->src[0]->type, a.w_row, a.x, a.ldx, a.out, a.ld_out, a.accumulate);
    }, true);
}

void out_prod(Tensor * n) {
    node::for_each_out_prod_batch(n, [&](const node::MatmulArgs & a) {
        matmul_bwd_w(a.K, a.N, a.T, a.x, a.ldx, a.y_in, a.ldy_in, a.out, a.ld_out, a.accumulate);
    });
}

namespace {

// The GEMMs' packed left operand (kernel_scratch.h), for the widest product a node makes: batches of fewer than
// kFoldColumns columns may run as one (for_each_gemm_batch).
int64_t product_columns(const Tensor * n) {
    const Tensor * outer = n->op == Op::MUL_MAT ? n->src[1] : n;
    const int64_t T = outer->ne[1];
    return T < node::kFoldColumns ? T * outer->ne[2] * outer->ne[3] : T;
}
size_t mul_mat_scratch(const Tensor * n) { return matmul_fwd_scratch_bytes(n->src[0]->ne[0], n->src[0]->ne[1], product_columns(n)); }
size_t mul_mat_back_x_scratch(const Tensor * n) {
    return matmul_bwd_x_scratch_bytes(n->src[0]->ne[0], n->src[0]->ne[1], product_columns(n));
}
size_t out_prod_scratch(const Tensor * n) { return matmul_bwd_w_scratch_bytes(n->ne[0], n->ne[1], n->src[0]->ne[1]); }

} // namespace

const RegisterKernels kRegister{{Op::MUL_MAT, mul_mat}, {Op::MUL_MAT_BACK_X, mul_mat_back_x}, {Op::OUT_PROD, out_prod}};
const RegisterScratch kRegisterScratch{
    {Op::MUL_MAT, mul_mat_scratch}, {Op::MUL_MAT_BACK_X, mul_mat_back_x_scratch}, {Op::OUT_PROD, out_prod_scratch}};

} // namespace rp::cpu
