// ggml-rp: the tensor engine. Include this one header to build, differentiate and run graphs on the CPU
// (the layers below it do not include each other upwards: core <- ops <- cpu).
//
// ---- Tensor layout -------------------------------------------------------------------------------------
// A Tensor (core/tensor.h) has a dtype, sizes ne[4] and byte strides nb[4] in GGUF/ggml order: ne[0] is the
// contiguous axis (a row), ne[1] counts rows, ne[2] and ne[3] are batch axes. Activations are [features,
// tokens, ...]; a weight is [in, out]. Views (reshape, permute, transpose, view) share memory and change only
// ne/nb/offset. Quantized GGUF block types are weight types: kernels dequantize them in tiles.
//
// ---- Ownership -----------------------------------------------------------------------------------------
// A Context (core/context.h) is an arena: it owns every Tensor struct created through it (pointers stay
// valid until the Context dies) and, when asked (alloc_data), host memory for leafs. Node memory belongs to
// the backend that runs the graph; weights may point anywhere (an mmapped GGUF file, a host store).
//
// ---- Build -> allocate -> compute ----------------------------------------------------------------------
//   rp::Context ctx;
//   auto * W = ctx.new_tensor(rp::DType::F32, 64, 32);   // W[in=64, out=32]; ctx.alloc_data(W) or point it
//   auto * x = ctx.new_tensor(rp::DType::F32, 64, 8);    // 8 tokens
//   auto * y = rp::silu(ctx, rp::mul_mat(ctx, W, x));    // records nodes; nothing runs yet
//   rp::Graph g;  rp::build_forward(g, y);               // topological order
//   rp::CpuBackend be;  be.allocate(g);                  // graph allocator: one buffer, reuse by liveness
//   be.compute(g, n_threads);                            // same bits for any n_threads
//   std::vector<float> out = rp::tensor_get_f32(y);      // (flag y kFlagOutput if more nodes follow it)
// Shape and type errors throw rp::Error at build time, naming the op and the shapes; bad runtime data
// (an id out of range) throws from compute. Nothing aborts.
//
// ---- build_backward ------------------------------------------------------------------------------------
//   rp::build_backward(ctx, g, loss, {W});   // loss: a scalar; W gets W->grad (f32, same shape; give it memory)
// appends the gradient nodes to g. Running g ADDS dloss/dW into W->grad (zero it yourself between steps), so
// several executions accumulate micro-batches. Only the listed params (leafs: weights, LoRA factors or a
// stage's inputs) are written; frozen weights never get gradients, and nodes that cannot reach a param are
// not differentiated. Each op's backward rule is in ggml_rp/ops/<family>.cpp beside its forward.
#pragma once

#include "base/error.h"
#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/context.h"
#include "ggml_rp/core/dtype.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/tensor.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_table.h"
#include "ggml_rp/ops/ops.h"
