#include "ggml_rp/roundpipe/transfer.h"

#include <algorithm>
#include <numeric>

namespace rp {

std::vector<CopyChunk> split_chunks(const std::vector<size_t> & sizes, size_t max_chunk) {
    if (max_chunk == 0) max_chunk = kMaxWeightChunk;
    std::vector<CopyChunk> out;
    for (size_t i = 0; i < sizes.size(); ++i)
        for (size_t off = 0; off < sizes[i]; off += max_chunk)
            out.push_back({static_cast<int>(i), off, std::min(max_chunk, sizes[i] - off)});
    return out;
}

std::vector<std::vector<CopyChunk>> lpt_groups(const std::vector<CopyChunk> & chunks, int n) {
    n = std::max(n, 1);
    std::vector<size_t> order(chunks.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return chunks[a].bytes > chunks[b].bytes; });
    std::vector<std::vector<CopyChunk>> groups(static_cast<size_t>(n));
    std::vector<size_t> load(static_cast<size_t>(n), 0);
    for (size_t i : order) {
        const size_t g = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        groups[g].push_back(chunks[i]);
        load[g] += chunks[i].bytes;
    }
    std::vector<size_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), size_t(0));
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return load[a] < load[b]; });
    std::vector<std::vector<CopyChunk>> out;
    for (size_t g : idx)
        if (!groups[g].empty()) out.push_back(std::move(groups[g]));
    return out;
}

} // namespace rp
