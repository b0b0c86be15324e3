// Fused, chunked LM head + cross-entropy on the GPU (CPU reference: ggml_rp/cpu/cross_entropy.h, the same
// math; op contract in ggml_rp/ops/cross_entropy.h). The [V x T] logits are never stored: per chunk of
// `chunk` vocabulary rows, a cuBLAS GEMM (ggml_rp/cuda/mul_mat.cuh, so any weight type) gives the chunk's
// logits, and a fused kernel folds them into a per-token online logsumexp (pass 1). With gradients asked
// for, pass 2 recomputes each chunk's logits, turns them in place into G = (softmax - onehot) * loss_scale
// (the label's p - 1 from pass 1's sum of the other probabilities, not 1 - a rounded p) and runs dh (+)= W_chunk G
// and dW_chunk += h G^T. Chunks run in order, every reduction has a fixed order:
// the same bits on every run.
//
// h: f32 [C, T] (column t at h + t*C); W: [C, V] of type wtype, row stride w_row_bytes; labels: i32 [T] in
// [0, V) or -1 (ignored). loss (device, one double) = sum_t loss_scale * (lse_t - logit_t[label_t]).
// dh (nullable) is overwritten; dW (nullable, f32, row n at dW + n*dw_row) is accumulated.
// A label outside [-1, V) is treated as ignored and sets *bad_label (device int, nullable) to 1.
// lse_out (device, nullable, T floats) receives each token's logsumexp; with lse_in (device, nullable: what a
// forward call wrote for the same h, W, labels) pass 1 is skipped -- one logits GEMM per chunk instead of two
// in the backward, the same gradient bits -- and *loss is not written.
// token_loss (device, nullable, T floats): each token's loss_scale * (logsumexp - label logit), 0 when masked.
// token_scale (device, nullable, T floats): token t's gradient is also multiplied by token_scale[t].
// (These four and the unit gradients are the fields of LmHeadCEAux.)
// workspace: lm_head_ce_workspace_bytes(C, V, T, chunk, wtype) bytes (launch.h); ce_chunk_rows picks a chunk.
#pragma once

#include "ggml_rp/ops/lm_head_state.h"
#include "gguf/types.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rp::cuda {

struct LmHeadCEShape {
    int64_t C;       // hidden size
    int64_t V;       // vocabulary
    int64_t T;       // tokens
    int64_t chunk;   // vocabulary rows per chunk (>= 1)
    float softcap = 0.0f;  // > 0: each logit l becomes softcap * tanh(l / softcap) (Gemma 2; the CPU's contract)
};

// The optional inputs and outputs (device pointers, each nullable; the CPU's LmHeadCEAux).
struct LmHeadCEAux {
    float * lse_out = nullptr;
    float * rest_out = nullptr;  // each token's 1 - p_label (the other probabilities summed apart; 0 when masked)
    const float * lse_in = nullptr;
    const float * rest_in = nullptr;  // with lse_in (both a forward call's)
    float * token_loss = nullptr;
    const float * token_scale = nullptr;
    // Forward: [C, T], each token's unit gradient d(lse - label logit)/dh (0 when masked), formed in pass 1:
    // the chunk's tile becomes exp(l - m) (times the cap's derivative, the label's entry 0), the running sums
    // are rescaled to each new maximum and dh_unit (+)= W_chunk tile; at the end, divided by the sum, less
    // (1 - p_label) times the label's row (gathered), the other probabilities summed apart from the label.
    float * unit_dh_out = nullptr;
    // Backward: the unit gradients of a forward call: dh = unit * loss_scale (* token_scale[t]); pass 2 then
    // runs only for dW.
    const float * unit_dh_in = nullptr;
};

void lm_head_ce(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                const int32_t * labels, float loss_scale, double * loss, float * dh, float * dW, int64_t dw_row,
                void * workspace, size_t workspace_bytes, int * bad_label, cudaStream_t stream,
                const LmHeadCEAux & aux = {});

// A streamed head's carried state (device pointers into its state tensor, ops/lm_head_state.h), as the CPU's;
// unit and label_rows with the gradient only.
using LmHeadCEState = LmHeadState;

// Folds vocabulary rows [v0, v0 + nv) (W_range: those rows; v0 a multiple of s.chunk) into st, as lm_head_ce's
// pass 1 does chunk by chunk; v0 == 0 starts the state. workspace: lm_head_ce_range_workspace_bytes (launch.h).
void lm_head_ce_range(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const void * W_range, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st, void * workspace, size_t workspace_bytes,
                      cudaStream_t stream);
// lm_head_ce's forward outputs from the state of every range: loss (device double), aux's lse_out, rest_out,
// token_loss and unit_dh_out (which needs st.unit). workspace: lm_head_ce_finish_workspace_bytes(T).
void lm_head_ce_finish(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st, double * loss,
                       void * workspace, size_t workspace_bytes, int * bad_label, cudaStream_t stream, const LmHeadCEAux & aux);

} // namespace rp::cuda
