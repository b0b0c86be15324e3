// GET_ROWS (dequantizing lookup), GET_ROWS_BACK (deterministic scatter-add: tokens are grouped by id
// with a counting sort, then each touched table row is summed by one thread in token order) and SEGMENT_SUM
// (the one-column scatter-add as a forward op).
#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "base/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace rp::cpu {

namespace {

// ids in token order (t fastest, then sequence); throws for an id outside [0, n_rows).
std::vector<int32_t> read_ids(const Tensor * node, const Tensor * ids, int64_t n_rows) {
    std::vector<int32_t> v = tensor_get_i32(ids);
    for (size_t i = 0; i < v.size(); ++i)
        if (v[i] < 0 || v[i] >= n_rows)
            throw Error(std::string(op_name(node->op)) + ": id " + std::to_string(v[i]) + " at position " + std::to_string(i) +
                        " of " + describe(ids) + " is outside the table's " + std::to_string(n_rows) + " rows");
    return v;
}

} // namespace

void get_rows(Tensor * n) {
    const Tensor * table = n->src[0];
    const std::vector<int32_t> id = read_ids(n, n->src[1], table->ne[1]);
    const int64_t C = table->ne[0], T = n->ne[1], nt = static_cast<int64_t>(id.size());
    const char * base = static_cast<const char *>(table->data);
    const DType type = table->type;
    const size_t tnb1 = table->nb[1];
    bool failed = false;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t k = 0; k < nt; ++k) {
        float * d = reinterpret_cast<float *>(row_ptr(n, k % T, k / T, 0));
        try {
            dequantize_row(type, base + static_cast<size_t>(id[static_cast<size_t>(k)]) * tnb1, d, C);
        } catch (...) {
#pragma omp atomic write
            failed = true;
        }
    }
    if (failed) throw Error("get_rows: cannot dequantize rows of " + describe(table));
}

void get_rows_back(Tensor * n) {
    const Tensor * dy = n->src[0];
    const bool accumulate = n->param_i32(0) != 0;
    const int64_t C = n->ne[0], V = n->ne[1], T = dy->ne[1];
    const std::vector<int32_t> id = read_ids(n, n->src[1], V);
    const int64_t nt = static_cast<int64_t>(id.size());

    // Counting sort of token indices by id (stable: token order within an id).
    std::vector<int64_t> start(static_cast<size_t>(V) + 1, 0);
    for (int32_t v : id) ++start[static_cast<size_t>(v) + 1];
    for (int64_t v = 0; v < V; ++v) start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
    std::vector<int64_t> order(static_cast<size_t>(nt));
    {
        std::vector<int64_t> fillp(start.begin(), start.end() - 1);
        for (int64_t k = 0; k < nt; ++k) order[static_cast<size_t>(fillp[static_cast<size_t>(id[static_cast<size_t>(k)])]++)] = k;
    }

    float * out = n->data_as<float>();  // contiguous [C, V]
    const size_t dnb0 = dy->nb[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t v = 0; v < V; ++v) {
        float * row = out + v * C;
        const int64_t b = start[static_cast<size_t>(v)], e = start[static_cast<size_t>(v) + 1];
        if (!accumulate) std::memset(row, 0, static_cast<size_t>(C) * sizeof(float));
        for (int64_t j = b; j < e; ++j) {
            const int64_t k = order[static_cast<size_t>(j)];
            const char * g = row_ptr(dy, k % T, k / T, 0);
            for (int64_t c = 0; c < C; ++c) row[c] += at(g, dnb0, c);
        }
    }
}

// SEGMENT_SUM: every segment summed in token order by one thread (a float per token: a pass over the ids).
void segment_sum(Tensor * n) {
    const Tensor * x = n->src[0];
    const int64_t S = n->ne[0], T = x->ne[0], B = x->ne[1];
    const std::vector<int32_t> id = read_ids(n, n->src[1], S);
    float * out = n->data_as<float>();
    std::fill(out, out + S, 0.0f);
    for (int64_t b = 0; b < B; ++b) {
        const char * row = row_ptr(x, b, 0, 0);
        for (int64_t t = 0; t < T; ++t) out[id[static_cast<size_t>(b * T + t)]] += at(row, x->nb[0], t);
    }
}

const RegisterKernels kRegister{{Op::GET_ROWS, get_rows}, {Op::GET_ROWS_BACK, get_rows_back}, {Op::SEGMENT_SUM, segment_sum}};

} // namespace rp::cpu
