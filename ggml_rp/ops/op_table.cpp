// The op table (op_table.h): one row per op, in the order of the Op enum.
#include "ggml_rp/ops/op_table.h"

#include "base/error.h"
#include "ggml_rp/cpu/kernels.h"
#include "ggml_rp/ops/backward_rules.h"

#include <string>

namespace rp {

namespace rules {
void no_gradient(Backward &, Tensor *) {}
} // namespace rules

namespace {

// CUDA traits, spelled out per row.
constexpr uint8_t kAll = 0x3f;  // every source read packed
constexpr uint8_t kFirst = 0x01;  // only source 0 (the activation; the others are weights, ids or labels)
constexpr CudaTraits kStrided{true, 0, false, false};                // reads and writes any strides
constexpr CudaTraits kElementwise{true, kAll, true, false};          // packed operands and output
constexpr CudaTraits kRowsFirst{true, kFirst, true, false};          // rope: packed activation and output
constexpr CudaTraits kIndexed{true, 0, false, true};                 // get_rows: weight rows + ids
constexpr CudaTraits kIndexedFirst{true, kFirst, false, true};       // scatter-add and the LM head
constexpr CudaTraits kPackedIn{true, kAll, false, false};            // attention: packed operands

using namespace rules;

constexpr OpDesc kOps[] = {
    {Op::NONE, "NONE", "leaf", nullptr, nullptr, kStrided},
    {Op::VIEW, "VIEW", "any ne/nb inside src0's memory", backward_view, nullptr, kStrided},
    {Op::FILL, "FILL", "shape given; every element = value", no_gradient, cpu::fill, kStrided},
    {Op::CPY, "CPY", "src0 -> same shape, contiguous, f32/f16/bf16", backward_copy, cpu::cpy, kStrided},
    {Op::ADD, "ADD", "a + b, b.ne[i] divides a.ne[i] -> a's shape", backward_binary, cpu::add, kElementwise},
    {Op::MUL, "MUL", "a * b, b.ne[i] divides a.ne[i] -> a's shape", backward_binary, cpu::mul, kElementwise},
    {Op::SCALE, "SCALE", "x -> x's shape", backward_unary, cpu::scale, kElementwise},
    {Op::SUM, "SUM", "x -> [1]", backward_reduce, cpu::sum, kStrided},
    {Op::MEAN, "MEAN", "x -> [1]", backward_reduce, cpu::mean, kStrided},
    {Op::REPEAT, "REPEAT", "x -> like's shape, x.ne[i] divides like.ne[i]", backward_reduce, cpu::repeat, kStrided},
    {Op::SUM_TO, "SUM_TO", "x -> like's shape, like.ne[i] divides x.ne[i]", backward_reduce, cpu::sum_to, kStrided},
    {Op::SILU, "SILU", "x -> x's shape", backward_unary, cpu::silu, kElementwise},
    {Op::SILU_BACK, "SILU_BACK", "x, dy (same shape) -> dx", nullptr, cpu::silu_back, kElementwise},
    {Op::SWIGLU, "SWIGLU", "gate, up (same shape) -> same shape", backward_unary, cpu::swiglu, kElementwise},
    {Op::SWIGLU_BACK, "SWIGLU_BACK", "gate, up, dy (same shape) -> dgate or dup", nullptr, cpu::swiglu_back, kElementwise},
    {Op::SOFTMAX, "SOFTMAX", "x [n, rows...] -> same shape, over ne[0]", backward_softmax, cpu::softmax, kElementwise},
    {Op::SOFTMAX_BACK, "SOFTMAX_BACK", "y, dy (same shape) -> dx", nullptr, cpu::softmax_back, kElementwise},
    {Op::RMS_NORM, "RMS_NORM", "x [n, rows...], w [n] or none -> x's shape", backward_norm, cpu::rms_norm, kElementwise},
    {Op::RMS_NORM_BACK, "RMS_NORM_BACK", "x, w, dy -> dx", nullptr, cpu::rms_norm_back, kElementwise},
    {Op::ROPE, "ROPE", "x [D, H, T, B], pos i32 [T] or [T*B], freq factors f32 [>= n_rot/2] (optional) -> x's shape", backward_rope, cpu::rope, kRowsFirst},
    {Op::ROPE_BACK, "ROPE_BACK", "dy [D, H, T, B], pos -> dx", backward_rope, cpu::rope, kRowsFirst},
    {Op::GET_ROWS, "GET_ROWS", "table [C, V], ids i32 [T, B] -> f32 [C, T, B]", backward_get_rows, cpu::get_rows, kIndexed},
    {Op::GET_ROWS_BACK, "GET_ROWS_BACK", "dy [C, T, B], ids -> [C, V]", nullptr, cpu::get_rows_back, kIndexedFirst},
    {Op::MUL_MAT, "MUL_MAT", "W [in, out] x X [in, T, b2, b3] -> [out, T, b2, b3]", backward_mul_mat, cpu::mul_mat, kStrided},
    {Op::MUL_MAT_BACK_X, "MUL_MAT_BACK_X", "W [in, out], dY [out, T, ..] -> dX [in, T, ..]", nullptr, cpu::mul_mat_back_x,
     kStrided},
    {Op::OUT_PROD, "OUT_PROD", "X [in, T, ..], dY [out, T, ..] -> dW [in, out]", nullptr, cpu::out_prod, kStrided},
    {Op::ATTENTION, "ATTENTION", "q [D, Hq, Tq, B], k, v [D, Hkv, Tk, B] -> [D, Hq, Tq, B] (+ lse)", backward_attention,
     cpu::attention, kPackedIn},
    {Op::ATTENTION_BACK, "ATTENTION_BACK", "q, k, v, o, lse, dout -> dq (+ dk, dv)", nullptr, cpu::attention_back, kPackedIn},
    {Op::LM_HEAD_CE, "LM_HEAD_CE", "h [C, T], W [C, V], labels i32 [T] -> [1] (+ lse [T])", backward_cross_entropy, cpu::lm_head_ce,
     kIndexedFirst},
    {Op::LM_HEAD_CE_BACK, "LM_HEAD_CE_BACK", "h, W, labels, dloss (, dW), ce -> dh [C, T]", nullptr, cpu::lm_head_ce_back,
     kIndexedFirst},
    {Op::DROPOUT, "DROPOUT", "x -> x's shape", backward_dropout, cpu::dropout, kElementwise},
    {Op::MOE_TOPK, "MOE_TOPK", "logits [E, T] -> ids i32 [k, T]", no_gradient, cpu::moe_topk, kStrided},
    {Op::MOE_WEIGHTS, "MOE_WEIGHTS", "logits [E, T], ids [k, T] -> [k, T]", backward_moe_weights, cpu::moe_weights, kIndexed},
    {Op::MOE_WEIGHTS_BACK, "MOE_WEIGHTS_BACK", "logits, ids, dw [k, T] -> dlogits [E, T]", nullptr, cpu::moe_weights_back, kIndexed},
    {Op::MUL_MAT_ID, "MUL_MAT_ID", "W [in, out, E] x X [in, 1|k, T], ids [k, T] -> [out, k, T]", backward_mul_mat_id,
     cpu::mul_mat_id, kIndexed},
    {Op::MUL_MAT_ID_BACK_X, "MUL_MAT_ID_BACK_X", "W, dY [out, k, T], ids -> dX [in, 1|k, T]", nullptr, cpu::mul_mat_id_back_x,
     kIndexed},
    {Op::OUT_PROD_ID, "OUT_PROD_ID", "X [in, 1|k, T], dY [out, k, T], ids -> dW [in, out, E]", nullptr, cpu::out_prod_id, kIndexed},
};
static_assert(sizeof kOps / sizeof kOps[0] == static_cast<size_t>(Op::COUNT), "one op table row per op");

constexpr bool rows_in_enum_order() {
    for (size_t i = 0; i < sizeof kOps / sizeof kOps[0]; ++i)
        if (static_cast<size_t>(kOps[i].op) != i) return false;
    return true;
}
static_assert(rows_in_enum_order(), "op table rows follow the Op enum");

} // namespace

const OpDesc & op_desc(Op op) {
    const size_t i = static_cast<size_t>(op);
    if (i >= static_cast<size_t>(Op::COUNT)) throw Error("op table: no op with value " + std::to_string(i));
    return kOps[i];
}

// Declared in core/tensor.h: the name comes from the table.
const char * op_name(Op op) {
    const size_t i = static_cast<size_t>(op);
    return i < static_cast<size_t>(Op::COUNT) ? kOps[i].name : "?";
}

} // namespace rp
