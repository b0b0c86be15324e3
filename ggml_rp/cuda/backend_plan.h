// Host-only rules of the CUDA backend (ggml_rp/cuda/backend.h), free of CUDA headers so the CPU tests check
// them on any machine:
//   - which ops have a CUDA path and how their operands are read (the op table's CUDA traits, ops/op_table.h)
//     and which node layouts the kernels take (check_cuda_node). The
//     launchers of ggml_rp/cuda/*.cuh read packed memory, while CPU graphs feed strided views to element-wise
//     ops freely: the backend packs such operands (and a strided in-place output) through scratch, so every
//     graph the CPU backend runs also runs here (packs_operand, packs_output, node_pack_bytes);
//   - the scratch each node needs (node_workspace_bytes, from the rules of launch.h, plus its packing); the
//     backend reserves the largest once, since the nodes of a graph run one after the other on one stream;
//   - the nodes that report bad runtime data (an id or label out of range) through a device flag, because
//     the host cannot read device ids before they are used (reports_bad_index).
// Header-only on purpose: the library builds ggml_rp/cuda/*.cu only (ggml_rp/CMakeLists.txt).
#pragma once

#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/dtype.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/tensor.h"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/ops/cross_entropy.h"
#include "ggml_rp/ops/node_args.h"
#include "ggml_rp/ops/op_table.h"
#include "base/error.h"

#include <cstddef>
#include <string>

namespace rp::cuda {

// The op table's CUDA traits (ops/op_table.h), read with a range check (Op::COUNT has none).
inline const CudaTraits * cuda_traits(Op op) {
    return static_cast<size_t>(op) < static_cast<size_t>(Op::COUNT) ? &op_desc(op).cuda : nullptr;
}

// True when the CUDA backend runs op.
inline bool cuda_has_op(Op op) {
    const CudaTraits * t = cuda_traits(op);
    return t && t->kernel;
}

// True for the nodes that set a device flag on an id or label outside its range (checked after a sync).
inline bool reports_bad_index(Op op) {
    const CudaTraits * t = cuda_traits(op);
    return t && t->reports_bad_index;
}

// Operands the kernels of op read as packed memory, so that the backend packs a strided one into scratch
// first (with the CPY kernel). The GEMMs take any column stride, and FILL, CPY, REPEAT, SUM_TO, SUM and MEAN
// read any strides; weights, ids and labels are never packed (the op builders give them packed rows;
// check_cuda_node refuses the rest).
inline bool packs_operand(Op op, int src) {
    const CudaTraits * t = cuda_traits(op);
    return t && src >= 0 && src < kMaxSrc && (t->packed_sources >> src & 1u) != 0;
}

// Ops whose strided output (an in-place node on a strided view) is computed packed in scratch and then
// copied into place.
inline bool packs_output(Op op) {
    const CudaTraits * t = cuda_traits(op);
    return t && t->packs_output;
}

inline size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Bytes of t packed (its elements back to back).
inline size_t packed_bytes(const Tensor * t) { return size_t(t->nelements()) * dtype_type_size(t->type); }

// Scratch the packing of node's strided operands and output takes (0 when everything is packed already).
inline size_t node_pack_bytes(const Tensor * n) {
    size_t b = 0;
    for (int i = 0; i < kMaxSrc; ++i) {
        if (n->src[i] && packs_operand(n->op, i) && !n->src[i]->is_contiguous()) b += align256(packed_bytes(n->src[i]));
    }
    if (packs_output(n->op) && !n->is_contiguous()) b += align256(packed_bytes(n));
    return b;
}

namespace detail {

[[noreturn]] inline void node_error(const Tensor * node, const std::string & why) {
    throw Error(std::string("cuda compute: ").append(op_name(node->op)).append(" node ").append(describe(node))
                    .append(": ").append(why));
}

inline void need_contiguous(const Tensor * node, const Tensor * t, const char * role) {
    if (t && !t->is_contiguous()) {
        node_error(node, std::string(role) + " " + describe(t) + " is not contiguous (the CUDA kernels read it " +
                             "packed; make it contiguous with cont() when building the graph)");
    }
}

inline void need_type(const Tensor * node, const Tensor * t, DType type, const char * role) {
    if (t && t->type != type) node_error(node, std::string(role) + " " + describe(t) + " must be " + dtype_name(type));
}

inline void need_f32_rows(const Tensor * node, const Tensor * t, const char * role) {
    need_type(node, t, DType::F32, role);
    if (t && (t->nb[0] != sizeof(float) || t->nb[1] % sizeof(float) != 0)) {
        node_error(node, std::string(role) + " " + describe(t) + " needs contiguous f32 rows");
    }
}

} // namespace detail

// Throws rp::Error naming the op and the node when the CUDA backend cannot run node as laid out (strided
// operands that packs_operand covers are fine: the backend packs them).
inline void check_cuda_node(const Tensor * n) {
    using detail::need_contiguous;
    using detail::need_f32_rows;
    using detail::need_type;
    if (!cuda_has_op(n->op)) detail::node_error(n, "no CUDA kernel for this op");
    for (int i = 0; i < kMaxSrc; ++i) {
        const Tensor * s = n->src[i];
        if (s && packs_operand(n->op, i) && !s->is_contiguous() && !dtype_is_float(s->type)) {
            detail::node_error(n, "source " + describe(s) + " is strided and not a float type");
        }
    }
    switch (n->op) {
    case Op::NONE: case Op::VIEW: return;
    case Op::CPY:
        if (!dtype_is_float(n->src[0]->type) || !dtype_is_float(n->type)) {
            detail::node_error(n, "CPY converts between f32, f16 and bf16 only");
        }
        return;
    case Op::FILL: case Op::REPEAT: case Op::SUM_TO: case Op::SUM: case Op::MEAN:
        need_type(n, n, DType::F32, "output");
        if (n->op == Op::FILL) need_contiguous(n, n, "output");
        return;  // the rest read and write through strides
    case Op::MUL_MAT: case Op::MUL_MAT_BACK_X:
        need_f32_rows(n, n->src[1], "activation");
        need_f32_rows(n, n, "output");
        if (!n->src[0]->rows_contiguous()) detail::node_error(n, "weight " + describe(n->src[0]) + " needs contiguous rows");
        return;
    case Op::OUT_PROD:
        need_f32_rows(n, n->src[0], "X");
        need_f32_rows(n, n->src[1], "dY");
        need_f32_rows(n, n, "dW");
        return;
    case Op::GET_ROWS:
        if (!n->src[0]->rows_contiguous()) detail::node_error(n, "table " + describe(n->src[0]) + " needs contiguous rows");
        need_type(n, n->src[1], DType::I32, "ids");
        need_contiguous(n, n->src[1], "ids");
        need_contiguous(n, n, "output");
        return;
    case Op::GET_ROWS_BACK:
        need_type(n, n->src[1], DType::I32, "ids");
        need_contiguous(n, n->src[1], "ids");
        need_contiguous(n, n, "output");
        return;
    case Op::SEGMENT_SUM:
        need_contiguous(n, n->src[0], "x");
        need_contiguous(n, n->src[1], "ids");
        need_contiguous(n, n, "output");
        return;
    case Op::LM_HEAD_CE: case Op::LM_HEAD_CE_BACK:
        if (!n->src[1]->rows_contiguous()) detail::node_error(n, "head weight " + describe(n->src[1]) + " needs contiguous rows");
        need_type(n, n->src[2], DType::I32, "labels");
        need_contiguous(n, n->src[2], "labels");
        if (n->op == Op::LM_HEAD_CE_BACK) {
            if (n->param_i32(3) != 0) need_contiguous(n, n->src[3], "per-token dloss");
            need_contiguous(n, n->src[4], "dW");
            need_contiguous(n, n, "dh");
        }
        return;
    case Op::LM_HEAD_CE_RANGE:
        if (!n->src[1]->rows_contiguous()) detail::node_error(n, "head weight range " + describe(n->src[1]) + " needs contiguous rows");
        need_type(n, n->src[2], DType::I32, "labels");
        need_contiguous(n, n->src[2], "labels");
        need_contiguous(n, n->src[3], "state");
        return;
    case Op::MOE_TOPK: case Op::MOE_WEIGHTS: case Op::MOE_WEIGHTS_BACK:
        need_type(n, n->src[0], DType::F32, "router logits");
        need_contiguous(n, n->src[0], "router logits");
        if (n->op != Op::MOE_TOPK) {
            need_type(n, n->src[1], DType::I32, "expert ids");
            need_contiguous(n, n->src[1], "expert ids");
        }
        need_contiguous(n, n, "output");
        return;
    case Op::MUL_MAT_ID: case Op::MUL_MAT_ID_BACK_X: case Op::OUT_PROD_ID:
        need_type(n, n->src[2], DType::I32, "expert ids");
        need_contiguous(n, n->src[2], "expert ids");
        for (int i : {0, 1})
            if (n->op == Op::OUT_PROD_ID || i == 1) {
                need_type(n, n->src[i], DType::F32, i == 0 ? "X" : n->op == Op::MUL_MAT_ID ? "X" : "dY");
                need_contiguous(n, n->src[i], i == 0 ? "X" : "activation");
            }
        if (n->op != Op::OUT_PROD_ID && !n->src[0]->is_contiguous())
            detail::node_error(n, "expert weights " + describe(n->src[0]) + " must be contiguous");
        need_contiguous(n, n, "output");
        return;
    case Op::ATTENTION: case Op::ATTENTION_BACK:
        need_contiguous(n, n, "output");
        if (n->src[0]->ne[0] > kAttnMaxHeadDim) detail::node_error(n, "head_dim above 256");
        if (const Tensor * ks = node::attention_key_start(n)) {
            need_type(n, ks, DType::I32, "key_start");
            need_contiguous(n, ks, "key_start");
        }
        if (const Tensor * sk = node::attention_sinks(n)) {
            need_type(n, sk, DType::F32, "sinks");
            need_contiguous(n, sk, "sinks");
        }
        return;
    case Op::ROPE: case Op::ROPE_BACK:
        need_type(n, n->src[1], DType::I32, "positions");
        need_contiguous(n, n->src[1], "positions");
        return;
    case Op::SSM_CONV: case Op::SSM_CONV_BACK: case Op::DELTA_NET: case Op::DELTA_NET_BACK: {
        // f32 operands packed by the builders, and the packed sequences' example starts (i32)
        const int seg = n->op == Op::SSM_CONV ? 3 : n->op == Op::SSM_CONV_BACK ? 4 : 6;
        for (int i = 0; i < kMaxSrc; ++i) {
            if (!n->src[i]) continue;
            if (i == seg) need_type(n, n->src[i], DType::I32, "seg_start");
            else need_type(n, n->src[i], DType::F32, "source");
            need_contiguous(n, n->src[i], i == seg ? "seg_start" : "source");
        }
        need_contiguous(n, n, "output");
        if ((n->op == Op::DELTA_NET || n->op == Op::DELTA_NET_BACK) && n->src[0]->ne[0] > kDeltaMaxDk)
            detail::node_error(n, "a key head of " + std::to_string(n->src[0]->ne[0]) + " > " + std::to_string(kDeltaMaxDk));
        return;
    }
    default:  // element-wise and row-wise: f32 operands (packed by the backend when strided)
        for (int i = 0; i < kMaxSrc; ++i) need_type(n, n->src[i], DType::F32, "source");
        need_type(n, n, DType::F32, "output");
        return;
    }
}

// ATTENTION / ATTENTION_BACK with f32 inputs and an accelerated type of f16 / bf16 (ops/attention.h): the
// inputs (q, k, v, and dout for the backward) are cast into scratch, 2 bytes an element, each section
// 256-byte aligned, after the kernel's own workspace. The f16 backward first has a 256-byte header: the
// power-of-two scale of dout (half_scale.h, attention_grad_scale_exponent) and its inverse.
inline bool attention_casts_inputs(const Tensor * n) {
    const DType acc = static_cast<DType>(n->param_i32(1));
    return (acc == DType::F16 || acc == DType::BF16) && n->src[0]->type == DType::F32;
}
inline bool attention_scales_grads(const Tensor * n) {
    return n->op == Op::ATTENTION_BACK && attention_casts_inputs(n) && static_cast<DType>(n->param_i32(1)) == DType::F16;
}
inline constexpr size_t kAttentionGradHeader = 256;
inline size_t attention_cast_bytes(const Tensor * n) {
    if (!attention_casts_inputs(n)) return 0;
    size_t b = attention_scales_grads(n) ? kAttentionGradHeader : 0;
    for (int i : {0, 1, 2, 5})
        if (n->src[i] && (i != 5 || n->op == Op::ATTENTION_BACK)) b += align256(size_t(n->src[i]->nelements()) * 2);
    return b;
}

// Scratch bytes node needs while it runs (0 for most ops), from the workspace rules of launch.h.
inline size_t node_workspace_bytes(const Tensor * n) {
    switch (n->op) {
    case Op::MUL_MAT: {
        const Tensor * W = n->src[0];
        return matmul_workspace_bytes(W->ne[0], W->ne[1], n->src[1]->ne[1], W->type);
    }
    case Op::MUL_MAT_BACK_X: {
        const Tensor * W = n->src[0];
        return matmul_workspace_bytes(W->ne[0], W->ne[1], n->ne[1], W->type);
    }
    case Op::LM_HEAD_CE: case Op::LM_HEAD_CE_BACK: {
        const Tensor * h = n->src[0];
        const Tensor * W = n->src[1];
        const int64_t chunk = n->param_i32(1) < 1 ? 1 : n->param_i32(1);
        if (lm_head_streamed(n))  // the finish from the state; the backward scales the unit gradients
            return n->op == Op::LM_HEAD_CE ? lm_head_ce_finish_workspace_bytes(h->ne[1]) : 0;
        return lm_head_ce_workspace_bytes(h->ne[0], W->ne[1], h->ne[1], chunk, W->type);
    }
    case Op::LM_HEAD_CE_RANGE: {
        const Tensor * h = n->src[0];
        const Tensor * W = n->src[1];
        const int64_t chunk = n->param_i32(1) < 1 ? 1 : n->param_i32(1);
        return lm_head_ce_range_workspace_bytes(h->ne[0], W->ne[1], h->ne[1], chunk, W->type);
    }
    case Op::ATTENTION: return attention_cast_bytes(n);
    case Op::ATTENTION_BACK: {
        const Tensor * q = n->src[0];
        const size_t own = attention_bwd_workspace_bytes(q->ne[1], q->ne[2], q->ne[3]);
        return attention_casts_inputs(n) ? align256(own) + attention_cast_bytes(n) : own;
    }
    case Op::GET_ROWS_BACK: case Op::SEGMENT_SUM: return get_rows_back_workspace_bytes(n->src[1]->nelements());
    case Op::DELTA_NET_BACK: {
        const Tensor * q = n->src[0];
        const Tensor * v = n->src[2];
        return delta_net_bwd_workspace_bytes(q->ne[0], v->ne[0], v->ne[1], q->ne[2], q->ne[3], n->param_i32(1));
    }
    case Op::MOE_TOPK: case Op::MOE_WEIGHTS: case Op::MOE_WEIGHTS_BACK:
        return moe_router_scratch(n->src[0]->ne[0], n->src[0]->ne[1], n->op == Op::MOE_WEIGHTS_BACK);
    case Op::MUL_MAT_ID: case Op::MUL_MAT_ID_BACK_X: {
        const Tensor * W = n->src[0];
        return moe_matmul_scratch(W->ne[0], W->ne[1], W->ne[2], n->src[2]->nelements(), W->type).total();
    }
    case Op::OUT_PROD_ID: return moe_matmul_scratch(n->ne[0], n->ne[1], n->ne[2], n->src[2]->nelements(), DType::F32).total();
    default: return 0;
    }
}

// All the scratch node takes while it runs: its kernel's workspace, then the packing of strided operands.
inline size_t node_scratch_bytes(const Tensor * n) { return align256(node_workspace_bytes(n)) + node_pack_bytes(n); }

// The device memory CudaBackend takes for a graph: its buffer (plan_graph with the 256-byte alignment every
// kernel needs), then its workspace: the largest node's scratch (the nodes run one after the other), one flag
// per node that reports bad ids, the f64 loss.
struct CudaGraphBytes {
    size_t buffer = 0;
    size_t scratch = 0;
    size_t flags = 0;  // count
    size_t workspace() const { return scratch + align256(flags * sizeof(int)) + align256(sizeof(double)); }
    size_t total() const { return align256(buffer) + workspace(); }
};
inline CudaGraphBytes cuda_graph_bytes(const Graph & g) {
    CudaGraphBytes b;
    b.buffer = plan_graph(g, 256).size;
    for (const Tensor * n : g.nodes) {
        b.scratch = b.scratch > node_scratch_bytes(n) ? b.scratch : node_scratch_bytes(n);
        if (reports_bad_index(n->op)) ++b.flags;
    }
    return b;
}

} // namespace rp::cuda
