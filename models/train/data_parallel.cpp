#include "models/train/data_parallel.h"

#include <cstring>

namespace rp {

GradientReducer::GradientReducer(Communicator & comm, const Trainer & trainer, size_t bucket_bytes)
    : comm_(comm), trainer_(trainer), bucket_bytes_(bucket_bytes) {}

void GradientReducer::add(int param) {
    const Trainer::Param & p = trainer_.params()[static_cast<size_t>(param)];
    pending_.push_back(param);
    pending_bytes_ += static_cast<size_t>(p.t->nelements()) * sizeof(float);
    ++added_;
    const bool last = added_ == trainer_.params().size();
    if (pending_bytes_ >= bucket_bytes_ || last) flush();
    if (last) {  // the step's hand-off is complete
        added_ = 0;
        bucket_ = 0;
        step_bytes_ = running_bytes_;
        running_bytes_ = 0;
    }
}

void GradientReducer::reduce_all() {
    for (size_t i = trainer_.params().size(); i-- > 0;) add(static_cast<int>(i));  // deep layers first, as the hand-off
}

void GradientReducer::flush() {
    if (pending_.empty()) return;
    const auto & params = trainer_.params();
    const std::string what = "all-reduce bucket " + std::to_string(bucket_++) + " (" + params[static_cast<size_t>(pending_.front())].name +
                             (pending_.size() > 1 ? " + " + std::to_string(pending_.size() - 1) + " more" : "") + ")";
    if (pending_.size() == 1) {  // one tensor: in place
        const Trainer::Param & p = params[static_cast<size_t>(pending_.front())];
        comm_.allreduce_sum(p.t->grad->data_as<float>(), static_cast<size_t>(p.t->nelements()), what);
    } else {
        staging_.resize(pending_bytes_ / sizeof(float));
        size_t off = 0;
        for (int i : pending_) {
            const Trainer::Param & p = params[static_cast<size_t>(i)];
            const size_t n = static_cast<size_t>(p.t->nelements());
            std::memcpy(staging_.data() + off, p.t->grad->data, n * sizeof(float));
            off += n;
        }
        comm_.allreduce_sum(staging_.data(), staging_.size(), what);
        off = 0;
        for (int i : pending_) {
            const Trainer::Param & p = params[static_cast<size_t>(i)];
            const size_t n = static_cast<size_t>(p.t->nelements());
            std::memcpy(p.t->grad->data, staging_.data() + off, n * sizeof(float));
            off += n;
        }
    }
    running_bytes_ += pending_bytes_;
    pending_.clear();
    pending_bytes_ = 0;
}

uint64_t fnv1a64(const void * data, size_t bytes, uint64_t h) {
    // FNV-1a over 8-byte words (then the tail bytes): a replica check of gigabytes of masters takes a second.
    const unsigned char * p = static_cast<const unsigned char *>(data);
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

ReplicaHashes replica_hashes(const Trainer & trainer, const Optimizer & optimizer) {
    ReplicaHashes r;
    for (const Trainer::Param & p : trainer.params()) {
        r.hashes.push_back(fnv1a64(p.t->data, static_cast<size_t>(p.t->nelements()) * sizeof(float)));
        r.names.push_back("'" + p.name + "'");
    }
    for (const StateArray & a : optimizer.state_arrays()) {
        r.hashes.push_back(fnv1a64(a.bytes(), a.size_bytes()));
        r.names.push_back("optimizer state '" + a.name + "'");
    }
    const int64_t step = optimizer.step();
    r.hashes.push_back(static_cast<uint64_t>(step));
    r.names.push_back("optimizer step count");
    return r;
}

} // namespace rp
