#include "ggml_rp/dist/communicator.h"

#include "ggml_rp/runtime/clock.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace rp {

namespace {

// Elements [lo(c), lo(c + 1)) of n belong to rank c.
size_t chunk_lo(size_t n, int c, int R) { return n * static_cast<size_t>(c) / static_cast<size_t>(R); }

} // namespace

void Communicator::timed_exchange(std::span<const Message> sends, std::span<const Message> recvs, const std::string & what) {
    const double t0 = clock_us();
    exchange(sends, recvs, what);
    size_t out = 0, in = 0;
    for (const Message & m : sends) out += m.bytes;
    for (const Message & m : recvs) in += m.bytes;
    if (opt_.link && !opt_.link->is_free()) {  // an emulated network: the exchange lasts what the link would take
        const double until = t0 + 1e6 * opt_.link->seconds(std::max(out, in));
        std::this_thread::sleep_until(clock_time_point(until));
    }
    const double t1 = clock_us();
    bytes_sent_ += out;
    seconds_ += (t1 - t0) * 1e-6;
    if (opt_.trace) {
        OpRecord rec;
        rec.device = opt_.trace_device;
        rec.stream = kAllReduceStream;
        rec.name = what;
        rec.cat = "allreduce";
        rec.start_us = t0;
        rec.end_us = t1;
        rec.bytes = out;
        opt_.trace(rec);
    }
}

template <class T> void Communicator::allreduce_impl(T * data, size_t n, const std::string & what) {
    const int R = size(), me = rank();
    if (R == 1 || n == 0) return;
    const size_t lo = chunk_lo(n, me, R), mine = chunk_lo(n, me + 1, R) - lo;
    // Reduce-scatter: my chunk of every other rank's buffer, into scratch[r].
    std::vector<T> scratch(mine * static_cast<size_t>(R));
    std::vector<Message> sends, recvs;
    for (int c = 0; c < R; ++c) {
        if (c == me) continue;
        const size_t clo = chunk_lo(n, c, R), cn = chunk_lo(n, c + 1, R) - clo;
        if (cn) sends.push_back({c, data + clo, cn * sizeof(T)});
        if (mine) recvs.push_back({c, scratch.data() + mine * static_cast<size_t>(c), mine * sizeof(T)});
    }
    timed_exchange(sends, recvs, what + " (reduce-scatter)");
    // The sum in rank order: ((x_0 + x_1) + x_2) + ..., the same on whichever rank owns the chunk.
    if (mine) {
        std::memcpy(scratch.data() + mine * static_cast<size_t>(me), data + lo, mine * sizeof(T));
        T * dst = data + lo;
        std::memcpy(dst, scratch.data(), mine * sizeof(T));
        for (int r = 1; r < R; ++r) {
            const T * src = scratch.data() + mine * static_cast<size_t>(r);
            for (size_t e = 0; e < mine; ++e) dst[e] = dst[e] + src[e];
        }
    }
    // All-gather of the owners' sums.
    sends.clear();
    recvs.clear();
    for (int c = 0; c < R; ++c) {
        if (c == me) continue;
        const size_t clo = chunk_lo(n, c, R), cn = chunk_lo(n, c + 1, R) - clo;
        if (mine) sends.push_back({c, data + lo, mine * sizeof(T)});
        if (cn) recvs.push_back({c, data + clo, cn * sizeof(T)});
    }
    timed_exchange(sends, recvs, what + " (all-gather)");
}

void Communicator::allreduce_sum(float * data, size_t n, const std::string & what) { allreduce_impl(data, n, what); }
void Communicator::allreduce_sum(double * data, size_t n, const std::string & what) { allreduce_impl(data, n, what); }

std::vector<uint64_t> Communicator::allgather(std::span<const uint64_t> values, const std::string & what) {
    const int R = size(), me = rank();
    const size_t n = values.size();
    std::vector<uint64_t> all(n * static_cast<size_t>(R));
    std::copy(values.begin(), values.end(), all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(me)));
    if (R == 1 || n == 0) return all;
    std::vector<Message> sends, recvs;
    for (int r = 0; r < R; ++r) {
        if (r == me) continue;
        sends.push_back({r, const_cast<uint64_t *>(values.data()), n * sizeof(uint64_t)});
        recvs.push_back({r, all.data() + n * static_cast<size_t>(r), n * sizeof(uint64_t)});
    }
    timed_exchange(sends, recvs, what);
    return all;
}

void Communicator::check_same(std::span<const uint64_t> values, const std::vector<std::string> & names, const std::string & what) {
    const std::vector<uint64_t> all = allgather(values, what);
    const size_t n = values.size();
    for (int r = 1; r < size(); ++r)
        for (size_t i = 0; i < n; ++i)
            if (all[static_cast<size_t>(r) * n + i] != all[i])
                throw PeerError(what + ": rank " + std::to_string(r) + "'s " + (i < names.size() ? names[i] : "value " + std::to_string(i)) +
                                " differs from rank 0's");
}

} // namespace rp
