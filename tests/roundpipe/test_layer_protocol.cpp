// The per-layer protocol of roundpipe.md §9.1 on its own (ggml_rp/roundpipe/layer_protocol.h), with events the
// test completes by hand: who blocks on what, the "started" rule (a flag before its event), the slot's running
// sum within a step, the optimizer's waits, and the release of a failed job.
#include "ggml_rp/roundpipe/layer_protocol.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/sync.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

namespace {

using namespace std::chrono_literals;

// An event the test completes: recorded (pending) until complete() is called.
class ManualEvent final : public rp::Event {
public:
    bool query() override {
        std::lock_guard<std::mutex> lk(m_);
        return done_;
    }
    void synchronize() override {
        std::unique_lock<std::mutex> lk(m_);
        ++waiters_;
        cv_.notify_all();
        cv_.wait(lk, [&] { return done_; });
    }
    double elapsed_ms(rp::Event &) override { return 0; }
    void complete() {
        {
            std::lock_guard<std::mutex> lk(m_);
            done_ = true;
        }
        cv_.notify_all();
    }
    // Blocks until someone synchronizes on the event (or 2 s).
    bool someone_waits() {
        std::unique_lock<std::mutex> lk(m_);
        return cv_.wait_for(lk, 2s, [&] { return waiters_ > 0; });
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    bool done_ = false;
    int waiters_ = 0;
};

// True when f has not returned after `ms` milliseconds; then lets the caller unblock it.
template <class F> std::future<void> start(F && f) { return std::async(std::launch::async, std::forward<F>(f)); }
bool blocked(std::future<void> & f, int ms = 30) { return f.wait_for(std::chrono::milliseconds(ms)) == std::future_status::timeout; }
bool finishes(std::future<void> & f) { return f.wait_for(2s) == std::future_status::ready; }

} // namespace

TEST(LayerProtocol, AnUploadClaimWaitsForTheLastUploadToBeEnqueued) {
    rp::LayerProtocol p({false, true});
    p.claim_upload(1);  // fresh: weights copied, no upload in flight
    auto second = start([&] { p.claim_upload(1); });
    EXPECT_TRUE(blocked(second)) << "a second job's upload must wait until the first one's is enqueued";
    p.upload_enqueued(1, std::make_shared<ManualEvent>());
    EXPECT_TRUE(finishes(second));
    p.claim_upload(0);  // other layers are independent
}

TEST(LayerProtocol, TheNextStepWaitsForTheCopyBackOfEachLayer) {
    rp::LayerProtocol p({true, true});
    p.begin_step();  // clears param_copied of every layer
    auto job = start([&] { p.claim_upload(0); });
    EXPECT_TRUE(blocked(job)) << "a job must not read weights the optimizer has not copied back";
    p.param_copied(1);
    EXPECT_TRUE(blocked(job)) << "layer 1's copy-back says nothing about layer 0";
    p.param_copied(0);
    EXPECT_TRUE(finishes(job));
}

TEST(LayerProtocol, AGradientSlotHoldsARunningSumWithinAStep) {
    rp::LayerProtocol p({true});
    EXPECT_FALSE(p.claim_grad_slot(0)) << "the first backward job of a step starts from zero";
    auto d1 = std::make_shared<ManualEvent>();
    p.grad_download_enqueued(0, d1);
    // The second call's job re-uploads the slot: it must wait until the first D2H into it has completed (edge 6).
    std::atomic<bool> reupload{false};
    auto claim = start([&] { reupload = p.claim_grad_slot(0); });
    ASSERT_TRUE(d1->someone_waits());
    EXPECT_TRUE(blocked(claim));
    d1->complete();
    EXPECT_TRUE(finishes(claim));
    EXPECT_TRUE(reupload);
    auto d2 = std::make_shared<ManualEvent>();
    p.grad_download_enqueued(0, d2);
    d2->complete();
    // step(): the controller clears the flags, the optimizer hands off and copies back; the next step's
    // first backward job starts from zero again.
    p.begin_step();
    p.wait_grad_downloaded(0);
    p.grad_copied(0);
    p.param_copied(0);
    EXPECT_FALSE(p.claim_grad_slot(0));
}

TEST(LayerProtocol, TheSlotIsNotReusedBeforeTheHandOff) {
    rp::LayerProtocol p({true});
    p.begin_step();
    p.param_copied(0);
    auto job = start([&] { p.claim_grad_slot(0); });
    EXPECT_TRUE(blocked(job)) << "the next step's D2H would overwrite a slot the optimizer is reading (edge 5)";
    p.grad_copied(0);
    EXPECT_TRUE(finishes(job));
}

TEST(LayerProtocol, TheHandOffWaitsForTheFlagThenTheEvent) {
    rp::LayerProtocol p({true});
    p.claim_grad_slot(0);  // a backward job is dispatched: grad_download_started cleared
    auto hand_off = start([&] { p.wait_grad_downloaded(0); });
    EXPECT_TRUE(blocked(hand_off)) << "the optimizer must not read before the D2H was even enqueued";
    auto d = std::make_shared<ManualEvent>();
    p.grad_download_enqueued(0, d);
    ASSERT_TRUE(d->someone_waits());
    EXPECT_TRUE(blocked(hand_off)) << "... nor before it completed";
    d->complete();
    EXPECT_TRUE(finishes(hand_off));
}

TEST(LayerProtocol, CopyBackWaitsForEveryUploadOfEveryLayer) {
    rp::LayerProtocol p({true, false, true});
    auto u0 = std::make_shared<ManualEvent>(), u2a = std::make_shared<ManualEvent>(), u2b = std::make_shared<ManualEvent>();
    p.claim_upload(0);
    p.upload_enqueued(0, u0);
    p.claim_upload(2);
    p.upload_enqueued(2, u2a);
    p.claim_upload(2);
    p.upload_enqueued(2, u2b);
    p.claim_upload(1);  // enqueued later: copy-back waits for the flag too
    auto copy_back = start([&] { p.wait_uploads_complete(); });
    EXPECT_TRUE(blocked(copy_back));
    auto u1 = std::make_shared<ManualEvent>();
    p.upload_enqueued(1, u1);
    u0->complete();
    u2a->complete();
    EXPECT_TRUE(blocked(copy_back)) << "one upload of layer 2 is still reading the working copy (edge 1)";
    u2b->complete();
    EXPECT_TRUE(blocked(copy_back)) << "layer 1's upload is still pending";
    u1->complete();
    EXPECT_TRUE(finishes(copy_back));
}

TEST(LayerProtocol, AFailedJobReleasesWhatItOwed) {
    rp::LayerProtocol p({true});
    const int64_t before = rp::HostFlag::violations();
    p.claim_upload(0);
    p.claim_grad_slot(0);
    p.release_after_failure(0, true);  // neither flag was set by the failed job: both are set now
    p.claim_upload(0);                 // would block forever otherwise
    auto hand_off = start([&] { p.wait_grad_downloaded(0); });
    EXPECT_TRUE(finishes(hand_off));
    p.release_after_failure(0, true);  // sets only what is not set
    EXPECT_EQ(rp::HostFlag::violations(), before);
    p.upload_enqueued(0, std::make_shared<ManualEvent>());  // the upload flag is already set: a consistency error
    EXPECT_EQ(rp::HostFlag::violations(), before + 1);
}

TEST(LayerProtocol, LayersOutsideTheModelAreRefused) {
    rp::LayerProtocol p({true, true});
    EXPECT_THROW(p.claim_upload(2), rp::Error);
    EXPECT_THROW(p.param_copied(-1), rp::Error);
}
