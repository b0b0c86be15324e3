// DROPOUT: element-wise over a strided source. The mask of element i (its logical flat index) comes from
// Philox block (counter_offset + i) / 4, so each value depends on its index only, never on the thread that
// computes it: bit-identical for any thread count, and to the CUDA kernel.
//
// Philox is a serial chain of ten multiply rounds per block and is the kernel's whole cost: one block at a
// time it took ~18 ns per element (1 thread, 4096 x 2048). Long stretches of a row are generated in runs of
// kBlocks consecutive blocks side by side (structure of arrays), which GCC vectorizes (SSE2, AVX2 and
// AVX-512 alike): ~3 ns per element. (With 16 blocks GCC 12 leaves it scalar.)
// Short rests use one block at a time. Same arithmetic as rp::philox4x32_10, so the same bits
// (tests/ops/test_dropout.cpp compares both paths with rng_uniform).
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/dropout.h"
#include "ggml_rp/ops/dropout_math.h"

#include <algorithm>

namespace rp::cpu {

namespace {

constexpr int kBlocks = 32;          // Philox blocks per run
constexpr int kWords = 4 * kBlocks;  // random words per run

// words[4 j + w] = word w of Philox block (first + j) mod 2^62 of `key`: what philox_block(key, b) gives
// (a counter wraps mod 2^64, so its block index wraps mod 2^62).
void philox_run(uint64_t key, uint64_t first, uint32_t words[kWords]) {
    constexpr uint64_t kBlockMask = (uint64_t{1} << 62) - 1;
    uint32_t c0[kBlocks], c1[kBlocks], c2[kBlocks], c3[kBlocks];
    for (int j = 0; j < kBlocks; ++j) {
        const uint64_t b = (first + static_cast<uint64_t>(j)) & kBlockMask;
        c0[j] = static_cast<uint32_t>(b);
        c1[j] = static_cast<uint32_t>(b >> 32);
        c2[j] = 0;
        c3[j] = 0;
    }
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += kPhiloxW0; k1 += kPhiloxW1; }
        for (int j = 0; j < kBlocks; ++j) {
            const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0[j];
            const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2[j];
            const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
            const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = static_cast<uint32_t>(p1);
            c3[j] = static_cast<uint32_t>(p0);
            c0[j] = n0;
            c2[j] = n2;
        }
    }
    for (int j = 0; j < kBlocks; ++j) {
        words[4 * j + 0] = c0[j];
        words[4 * j + 1] = c1[j];
        words[4 * j + 2] = c2[j];
        words[4 * j + 3] = c3[j];
    }
}

} // namespace

void dropout(Tensor * n) {
    const DropoutParams d = dropout_params(n);
    const Tensor * x = n->src[0];
    const int64_t ne0 = n->ne[0], nr = n->nrows();
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * s = row_ptr(x, ri);
        char * dst = row_ptr(n, ri);
        const size_t snb = x->nb[0], dnb = n->nb[0];
        // Counter of element i of this row: base + i, mod 2^64 like the offset itself (unsigned arithmetic).
        const uint64_t base = d.counter_offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(ne0);
        uint32_t words[kWords];
        for (int64_t i = 0; i < ne0;) {
            const uint64_t c = base + static_cast<uint64_t>(i);
            const int w0 = static_cast<int>(c & 3u);  // a stretch starts at word c % 4 of its first block
            const uint32_t * w;
            int64_t m;
            Philox4x32 one;
            if (ne0 - i >= kWords / 2) {
                philox_run(d.key, c >> 2, words);
                w = words + w0;
                m = std::min<int64_t>(ne0 - i, kWords - w0);
            } else {
                one = philox_block(d.key, c >> 2);
                w = one.v + w0;
                m = std::min<int64_t>(ne0 - i, 4 - w0);
            }
            for (int64_t k = 0; k < m; ++k) at(dst, dnb, i + k) = dropout_f(at(s, snb, i + k), w[k], d.p, d.scale);
            i += m;
        }
    }
}

const RegisterKernels kRegister{{Op::DROPOUT, dropout}};

} // namespace rp::cpu
