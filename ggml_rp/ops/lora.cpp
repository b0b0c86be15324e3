#include "ggml_rp/ops/lora.h"

#include "ggml_rp/ops/mul_mat.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/unary.h"

namespace rp {

Tensor * lora_linear(Context & ctx, Tensor * W, Tensor * A, Tensor * B, Tensor * x, float s) {
    detail::require(W && A && B && x, "lora_linear", "null operand");
    detail::require(A->ne[0] == W->ne[0] && B->ne[1] == W->ne[1] && A->ne[1] == B->ne[0], "lora_linear",
                    "adapter A " + describe(A) + " and B " + describe(B) + " do not fit W " + describe(W) +
                        " (need A [in, r], B [r, out] for W [in, out])");
    Tensor * u = mul_mat(ctx, A, x);   // (before W x: lora.h says why)
    return lora_up(ctx, B, u, s, mul_mat(ctx, W, x));
}

Tensor * lora_up(Context & ctx, Tensor * B, Tensor * u, float s, Tensor * into) {
    return mul_mat(ctx, B, s == 1.0f ? u : scale(ctx, u, s), into);
}

} // namespace rp
