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

std::shared_ptr<Event> TransferEngine::record(StreamKind s) {
    std::shared_ptr<Event> ev = dev_.create_event();
    dev_.stream(s).record(*ev);
    return ev;
}

void TransferEngine::upload_activation(void * dst, const void * src, size_t bytes, Event * ready, const OpLabel & label) {
    Stream & as = dev_.stream(StreamKind::ActivationUpload);
    if (ready) as.wait(*ready);
    as.copy(dst, src, bytes, CopyKind::HostToDevice, label);
}

void TransferEngine::activations_uploaded() {
    std::shared_ptr<Event> mark = record(StreamKind::ActivationUpload);
    marks_.push_back(mark);
    dev_.stream(StreamKind::Compute).wait(*mark);
}

std::shared_ptr<Event> TransferEngine::upload_weights(const std::vector<WeightCopy> & copies, const OpLabel & label,
                                                      const std::function<void(Stream &, Stream &)> & also) {
    Stream & ws = dev_.stream(StreamKind::WeightUpload);
    Stream & cs = dev_.stream(StreamKind::Compute);
    // Activations first: the marks of activation uploads still pending on this device.
    while (!marks_.empty() && marks_.front()->query()) marks_.pop_front();
    const std::vector<std::shared_ptr<Event>> pending(marks_.begin(), marks_.end());

    std::vector<size_t> sizes;
    for (const WeightCopy & c : copies) sizes.push_back(c.bytes);
    const auto groups = lpt_groups(split_chunks(sizes), static_cast<int>(pending.size()));
    for (size_t g = 0; g < groups.size(); ++g) {
        if (g < pending.size()) {
            ws.wait(*pending[g]);
            obs_.weight_group_queued(ws, label, std::vector<std::shared_ptr<Event>>(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(g + 1)));
        }
        for (const CopyChunk & ch : groups[g]) {
            const WeightCopy & c = copies[static_cast<size_t>(ch.tensor)];
            ws.copy(static_cast<char *>(c.dst) + ch.offset, static_cast<const char *>(c.src) + ch.offset, ch.bytes,
                    CopyKind::HostToDevice, label);
        }
    }
    if (also) also(ws, cs);
    std::shared_ptr<Event> done = record(StreamKind::WeightUpload);
    cs.wait(*done);
    return done;
}

void TransferEngine::limit_prefetch() {
    std::shared_ptr<Event> tail = record(StreamKind::Compute);
    dev_.stream(StreamKind::WeightUpload).wait(*tail);
}

void TransferEngine::downloads_after_compute() { dev_.stream(StreamKind::Download).wait(*record(StreamKind::Compute)); }

void TransferEngine::copy_down(void * dst, const void * src, size_t bytes, const OpLabel & label) {
    dev_.stream(StreamKind::Download).copy(dst, src, bytes, CopyKind::DeviceToHost, label);
}

std::shared_ptr<Event> TransferEngine::download(void * dst, const void * src, size_t bytes, const OpLabel & label) {
    downloads_after_compute();
    copy_down(dst, src, bytes, label);
    return record(StreamKind::Download);
}

} // namespace rp
