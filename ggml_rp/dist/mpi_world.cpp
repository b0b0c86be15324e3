#include "ggml_rp/dist/mpi_world.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include <thread>
#include <chrono>

#ifdef RP_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (MPI's C++ bindings are deprecated and need libmpi_cxx)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace rp {

namespace {

int env_int(const char * name) {
    const char * v = std::getenv(name);
    return v && *v ? std::atoi(v) : -1;
}

} // namespace

bool MpiWorld::launched() { return launched_size() > 0; }

int MpiWorld::launched_size() {
    for (const char * name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"}) {
        const int n = env_int(name);
        if (n > 0) return n;
    }
    return 0;
}

#ifdef RP_HAVE_MPI

namespace {

bool g_initialized = false;

class MpiCommunicator final : public Communicator {
public:
    MpiCommunicator(MPI_Comm comm, const CommOptions & opt) : Communicator(opt), comm_(comm) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
        int flag = 0;
        void * ub = nullptr;
        MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
        tag_ub_ = flag && ub ? *static_cast<int *>(ub) : 32767;
    }
    ~MpiCommunicator() override {
        // A communicator with messages still in flight (a peer failed) is left to MPI_Abort.
        if (clean_ && g_initialized) MPI_Comm_free(&comm_);
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::unique_ptr<Communicator> duplicate() override {
        MPI_Comm dup;
        MPI_Comm_dup(comm_, &dup);
        return std::make_unique<MpiCommunicator>(dup, options());
    }

protected:
    void exchange(std::span<const Message> sends, std::span<const Message> recvs, const std::string & what) override {
        const int tag = 1 + static_cast<int>(seq_++ % static_cast<uint64_t>(tag_ub_ - 1));
        // Messages over 1 GiB go in pieces (MPI counts are int).
        constexpr size_t kPiece = size_t(1) << 30;
        std::vector<MPI_Request> reqs;
        std::vector<int> peer_of;  // per request: the peer, negative for a send
        for (const Message & m : recvs)
            for (size_t off = 0; off < m.bytes; off += kPiece) {
                const int count = static_cast<int>(std::min(kPiece, m.bytes - off));
                reqs.emplace_back();
                MPI_Irecv(static_cast<char *>(m.data) + off, count, MPI_BYTE, m.peer, tag, comm_, &reqs.back());
                peer_of.push_back(m.peer);
            }
        for (const Message & m : sends)
            for (size_t off = 0; off < m.bytes; off += kPiece) {
                const int count = static_cast<int>(std::min(kPiece, m.bytes - off));
                reqs.emplace_back();
                MPI_Isend(static_cast<char *>(m.data) + off, count, MPI_BYTE, m.peer, tag, comm_, &reqs.back());
                peer_of.push_back(-1 - m.peer);
            }
        // Poll with a deadline: MPI has no timed wait. The sleep grows to 200 us so a long wait costs no core.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options().timeout_s);
        int done = 0;
        double sleep_us = 0;
        for (;;) {
            MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
            if (done) return;
            if (std::chrono::steady_clock::now() > deadline) break;
            if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(sleep_us));
            sleep_us = std::min(200.0, sleep_us + 1.0);
        }
        clean_ = false;
        std::string missing, unsent;
        for (size_t i = 0; i < reqs.size(); ++i) {
            int one = 0;
            if (reqs[i] != MPI_REQUEST_NULL) MPI_Test(&reqs[i], &one, MPI_STATUS_IGNORE);
            if (one || reqs[i] == MPI_REQUEST_NULL) continue;
            std::string & list = peer_of[i] >= 0 ? missing : unsent;
            const std::string r = std::to_string(peer_of[i] >= 0 ? peer_of[i] : -1 - peer_of[i]);
            if (list.find(" " + r + ",") == std::string::npos) list += " " + r + ",";
        }
        if (!missing.empty()) missing.pop_back();
        if (!unsent.empty()) unsent.pop_back();
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", options().timeout_s);
        throw PeerError("data parallel: rank " + std::to_string(rank_) + " waited " + secs + " s (timeout_s) in " + what +
                        (missing.empty() ? "" : " for rank" + missing) + (unsent.empty() ? "" : "; undelivered to rank" + unsent) +
                        ": that rank died, hangs or is far behind");
    }

private:
    MPI_Comm comm_;
    int rank_ = 0, size_ = 1, tag_ub_ = 32767;
    uint64_t seq_ = 0;
    bool clean_ = true;
};

} // namespace

bool MpiWorld::available() { return true; }

std::unique_ptr<Communicator> MpiWorld::init(int * argc, char *** argv, const CommOptions & options) {
    if (!g_initialized) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) throw Error("MPI_Init_thread failed");
        g_initialized = true;
        if (provided < MPI_THREAD_MULTIPLE)
            throw Error("this MPI library does not provide MPI_THREAD_MULTIPLE (the optimizer thread reduces gradients "
                        "while the main thread runs the next step)");
        // A failing MPI call returns an error instead of aborting, so it reaches our error path.
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    return std::make_unique<MpiCommunicator>(dup, options);
}

void MpiWorld::finalize() {
    if (g_initialized) MPI_Finalize();
    g_initialized = false;
}

void MpiWorld::abort(int code) {
    if (g_initialized) MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
}

#else

bool MpiWorld::available() { return false; }
std::unique_ptr<Communicator> MpiWorld::init(int *, char ***, const CommOptions &) {
    throw Error("data parallelism needs a build with MPI: install Open MPI (apt-get install libopenmpi-dev openmpi-bin) "
                "and configure with -DRP_MPI=ON (AUTO finds it)");
}
void MpiWorld::finalize() {}
void MpiWorld::abort(int code) { std::_Exit(code); }

#endif

} // namespace rp
