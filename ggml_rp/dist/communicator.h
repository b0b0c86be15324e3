// Data parallelism between processes (architecture.md §8): the collectives a data-parallel run needs, over
// point-to-point messages, in a fixed order so that every result is the same bits on every rank and in
// every run (MPI's own MPI_Allreduce leaves the summation order unspecified).
//
//   allreduce_sum  element-wise sum over the ranks, always ((x_0 + x_1) + x_2) + ... in rank order: a
//                  reduce-scatter (the owner of each 1/R of the buffer receives every rank's copy of it and
//                  sums them in rank order) then an all-gather of the sums. Each rank sends and receives
//                  2 (R - 1) / R of the buffer, as a ring does, in 2 rounds instead of 2 (R - 1).
//   allgather      every rank's values, rank-major.
//
// A transport implements exchange() (post sends and receives, wait for all of them with a deadline); the
// algorithms live here once. The MPI transport is dist/mpi_world.h. No collective waits forever: a peer that
// sends nothing within timeout_s is a PeerError naming the peer and the collective.
//
// Threads: one communicator is used by one thread at a time; a second thread talking at the same time
// (the pipeline's optimizer thread all-reduces gradients while the caller's thread reduces losses) uses
// duplicate(), whose messages never mix with this one's.
#pragma once

#include "base/error.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/link_model.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rp {

// A peer failed: it sent nothing within the timeout (it died or hangs), or it disagrees with this rank.
struct PeerError : Error {
    explicit PeerError(const std::string & what) : Error(what) {}
};

struct CommOptions {
    double timeout_s = 300;  // the longest a collective waits for a peer
    // Emulates an inter-node link on one machine (benchmarks): each exchange lasts at least
    // latency + (the larger of the bytes this rank sends and receives) / bandwidth.
    std::optional<LinkModel> link;
    // Records one operation per exchange (device = trace_device, stream kAllReduceStream, cat "allreduce").
    OpHook trace;
    int trace_device = 0;
};

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;

    // Element-wise sum over the ranks of data[0..n) (the same n on every rank), in rank order; every rank
    // receives the same bits. `what` names the data in errors and in the trace.
    void allreduce_sum(float * data, size_t n, const std::string & what);
    void allreduce_sum(double * data, size_t n, const std::string & what);
    // Every rank's n values: [size()][n].
    std::vector<uint64_t> allgather(std::span<const uint64_t> values, const std::string & what);
    // Throws PeerError when some rank's values differ from rank 0's: "`what`: rank R has ... rank 0 ...".
    // names[i] names values[i] in the message.
    void check_same(std::span<const uint64_t> values, const std::vector<std::string> & names, const std::string & what);

    // A communicator over the same ranks whose messages never mix with this one's (for another thread).
    virtual std::unique_ptr<Communicator> duplicate() = 0;
    const CommOptions & options() const { return opt_; }
    void set_options(const CommOptions & o) { opt_ = o; }

    // Bytes this rank has sent, and seconds spent in collectives (for progress lines and benchmarks).
    uint64_t bytes_sent() const { return bytes_sent_; }
    double seconds_in_collectives() const { return seconds_; }

    struct Message {
        int peer;
        void * data;
        size_t bytes;
    };

protected:
    explicit Communicator(CommOptions opt) : opt_(std::move(opt)) {}
    // Posts every send and receive, then waits until all have completed or timeout_s has passed (PeerError
    // naming the ranks still missing and `what`). Every rank posts its exchanges in the same order.
    virtual void exchange(std::span<const Message> sends, std::span<const Message> recvs, const std::string & what) = 0;

private:
    template <class T> void allreduce_impl(T * data, size_t n, const std::string & what);
    void timed_exchange(std::span<const Message> sends, std::span<const Message> recvs, const std::string & what);

    CommOptions opt_;
    uint64_t bytes_sent_ = 0;
    double seconds_ = 0;
};

} // namespace rp
