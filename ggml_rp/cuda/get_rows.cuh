// Embedding lookup and its deterministic scatter-add backward on the GPU (CPU reference:
// ggml_rp/cpu/get_rows.cpp).
//   get_rows:      out[:, k] = dequant(table row ids[k])      out: contiguous f32 [C, n_ids]
//   get_rows_back: dtable[:, v] (+)= sum over k with ids[k] == v, in token order, of dy[:, k]
// The table may be f32, f16, bf16 or a GGUF block type (rows of row_bytes bytes). Ids must lie in
// [0, n_rows): the host side cannot see device ids without a sync, so an id outside the range is not read
// (its output row is NaN in the forward and its gradient is dropped in the backward) and *bad_id (device int,
// nullable) is set to 1, for the caller to check after its next sync.
// The backward never uses float atomics: each touched row is owned by the first token with its id, which
// walks the chain of later tokens with the same id in order. So the result is the same bits on every run and
// equals the CPU's order of summation.
#pragma once

#include "gguf/types.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rp::cuda {

void get_rows(const void * table, gguf::TensorType type, size_t row_bytes, int64_t n_rows, int64_t C,
              const int32_t * ids, int64_t n_ids, float * out, int * bad_id, cudaStream_t stream);

// dtable: contiguous f32 [C, n_rows]; dy: contiguous f32 [C, n_ids]. accumulate = false zeroes dtable first.
// workspace: get_rows_back_workspace_bytes(n_ids) bytes (launch.h), device memory.
void get_rows_back(const float * dy, const int32_t * ids, int64_t n_ids, float * dtable, int64_t C, int64_t n_rows,
                   bool accumulate, void * workspace, size_t workspace_bytes, int * bad_id, cudaStream_t stream);

} // namespace rp::cuda
