// The dispatcher (ggml_rp/roundpipe/dispatcher.h, issue #37) on its own: identical devices keep the round-robin
// pointer exactly, slower devices get fewer jobs by readiness (and the same share as the others under
// round-robin), measured speeds converge to the devices' real ratios and snap to 1 within the noise band, and
// bad speeds are refused.
#include "ggml_rp/roundpipe/dispatcher.h"

#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

namespace {

using rp::DispatchKind;
using rp::Dispatcher;

// A call of RoundPipe-like jobs: 3 forward stages, FB, 3 backward stages, M micro-batches each, stage times
// that differ (the fused stage the longest).
std::vector<std::vector<double>> call_jobs(int M) {
    const std::vector<double> stage_ms = {1, 1.2, 0.8, 4, 2.5, 3, 2};
    std::vector<std::vector<double>> jobs;
    for (double t : stage_ms) jobs.emplace_back(static_cast<size_t>(M), t);
    return jobs;
}

std::vector<int> run_calls(Dispatcher & d, int calls, int M) {
    std::vector<int> devices;
    for (int c = 0; c < calls; ++c) {
        d.begin_call(false);
        for (const auto & job : call_jobs(M)) devices.push_back(d.pick(job));
    }
    return devices;
}

// The finish of the model's last job (the runtime's constraints, recomputed here independently for an
// assignment): the controller hands jobs over in order, each once its device's third-last job has finished
// (prefetch depth 1); a device's micro-batch m starts after its previous one and after the call's previous
// job's micro-batch m.
double makespan(const std::vector<int> & devices, const std::vector<double> & speed, int calls, int M) {
    std::vector<std::vector<double>> ends(speed.size());  // each device's jobs' ends
    double controller = 0, end = 0;
    size_t k = 0;
    for (int c = 0; c < calls; ++c) {
        std::vector<double> prev;
        for (const auto & job : call_jobs(M)) {
            const size_t d = static_cast<size_t>(devices[k++]);
            const std::vector<double> & mine = ends[d];
            controller = std::max(controller, mine.size() >= 3 ? mine[mine.size() - 3] : 0.0);
            double t = std::max(controller, mine.empty() ? 0.0 : mine.back());
            std::vector<double> e(job.size());
            for (size_t m = 0; m < job.size(); ++m) {
                t = std::max(t, prev.empty() ? 0.0 : prev[m]) + job[m] / speed[d];
                e[m] = t;
            }
            ends[d].push_back(e.back());
            end = std::max(end, e.back());
            prev = e;
        }
    }
    return end;
}

} // namespace

TEST(Dispatcher, NamesRoundTripAndBadOnesAreRefused) {
    for (DispatchKind k : {DispatchKind::RoundRobin, DispatchKind::Ready})
        EXPECT_EQ(rp::dispatch_from_name(rp::dispatch_name(k)), k);
    try {
        rp::dispatch_from_name("fastest");
        FAIL() << "accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("fastest"), std::string::npos) << e.what();
    }
}

TEST(Dispatcher, IdenticalDevicesKeepTheRoundRobinPointer) {
    for (const std::vector<double> & given : {std::vector<double>{}, std::vector<double>{2, 2, 2, 2}, std::vector<double>{1, 0.9, 0.95, 1}}) {
        Dispatcher d(4, DispatchKind::Ready, given);
        const std::vector<int> dev = run_calls(d, 5, 6);
        for (size_t k = 0; k < dev.size(); ++k) ASSERT_EQ(dev[k], static_cast<int>(k % 4)) << "job " << k;
        for (double s : d.speeds()) EXPECT_EQ(s, 1.0);  // within kSameSpeed of the fastest counts as equal
    }
}

// Mixed memory: a job whose stage only some devices hold goes to one of them — by the pointer (the next allowed
// device in its order; the pointer then moves past it) or by readiness among them; no device allowed is a
// programming error the dispatcher names.
TEST(Dispatcher, AJobGoesOnlyToTheDevicesAllowedToRunIt) {
    const std::vector<double> ms(3, 1.0);
    const std::vector<char> big{1, 0, 1, 0}, all{1, 1, 1, 1};
    for (DispatchKind kind : {DispatchKind::RoundRobin, DispatchKind::Ready}) {
        Dispatcher d(4, kind);
        d.begin_call(true);
        EXPECT_EQ(d.pick(ms, false, &all), 0);
        EXPECT_EQ(d.pick(ms, false, &big), 2);  // the pointer names 1: the next allowed is 2
        EXPECT_EQ(d.pick(ms, false, &big), 0);  // 3 is not allowed
        EXPECT_EQ(d.pick(ms, false, nullptr), 1);
        EXPECT_EQ(d.pointer(), 2);
        const std::vector<char> wrong(3, 1), none(4, 0);
        EXPECT_THROW(d.pick(ms, false, &wrong), rp::Error);
        EXPECT_THROW(d.pick(ms, false, &none), rp::Error);
    }
    // By readiness on mixed speeds: of the two allowed devices the one that finishes first (the fast one, even
    // when the pointer names the other); every job lands on an allowed device.
    Dispatcher d(4, DispatchKind::Ready, {0.25, 1, 1, 1});
    d.begin_call(true);
    const std::vector<char> slow_or_fast{1, 0, 1, 0};
    EXPECT_EQ(d.pick(ms, false, &slow_or_fast), 2);
    for (int k = 0; k < 20; ++k) {
        const int dev = d.pick(ms, false, &slow_or_fast);
        EXPECT_TRUE(dev == 0 || dev == 2) << dev;
    }
}

TEST(Dispatcher, SlowerDevicesGetFewerJobsByReadinessAndTheChainEndsSooner) {
    for (const std::vector<double> & speed : {std::vector<double>{1, 1, 0.5, 0.5}, std::vector<double>{1, 1, 1, 0.25}}) {
        const int calls = 8, M = 6;
        Dispatcher ready(4, DispatchKind::Ready, speed);
        Dispatcher rr(4, DispatchKind::RoundRobin, speed);
        const std::vector<int> a = run_calls(ready, calls, M), b = run_calls(rr, calls, M);
        for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], static_cast<int>(k % 4));
        EXPECT_NE(a, b);
        const auto & jobs = ready.jobs_per_device();
        const int64_t total = std::accumulate(jobs.begin(), jobs.end(), int64_t(0));
        EXPECT_EQ(total, static_cast<int64_t>(a.size()));
        double slow = 0, fast = 0, n_slow = 0, n_fast = 0, speed_sum = 0, work = 0;
        for (size_t d = 0; d < speed.size(); ++d) {
            (speed[d] < 1 ? slow : fast) += static_cast<double>(jobs[d]);
            (speed[d] < 1 ? n_slow : n_fast) += 1;
            speed_sum += speed[d];
        }
        EXPECT_LT(slow / n_slow, fast / n_fast) << "a slow device kept its round-robin share";
        for (const auto & job : call_jobs(M))
            for (double t : job) work += calls * t;
        const double ready_ms = makespan(a, speed, calls, M), rr_ms = makespan(b, speed, calls, M), ideal_ms = work / speed_sum;
        EXPECT_LT(ready_ms, 0.8 * rr_ms);  // (the ideal ignores the chain and the controller: no bound against it)
        EXPECT_GT(ready_ms, ideal_ms);
        std::printf("[ model ] speeds %g,%g,%g,%g: by readiness %.1f, round-robin %.1f, ideal %.1f (work / summed speed)\n",
                    speed[0], speed[1], speed[2], speed[3], ready_ms, rr_ms, ideal_ms);
    }
}

TEST(Dispatcher, MeasuredSpeedsFollowTheDevicesAndIgnoreNoise) {
    // Keys (layer, kind) move around the devices as the pointer does; device 3 takes 4x as long, device 1 10% longer.
    const std::vector<double> slowdown = {1, 1.1, 1, 4};
    Dispatcher d(4, DispatchKind::Ready);
    for (int call = 0; call < 12; ++call) {
        std::vector<Dispatcher::Launch> launches;
        for (int key = 0; key < 7; ++key) {
            const int dev = (call * 7 + key) % 4;
            for (int m = 0; m < 3; ++m) launches.push_back({dev, key, (1.0 + key) * slowdown[static_cast<size_t>(dev)]});
        }
        d.add_call(launches);
        if (call == 0) {
            for (double s : d.speeds()) EXPECT_EQ(s, 1.0) << "the first call only seeds the references";
        }
    }
    const std::vector<double> & s = d.speeds();
    EXPECT_EQ(s[0], 1.0);
    EXPECT_EQ(s[1], 1.0);  // 10% slower: noise
    EXPECT_EQ(s[2], 1.0);
    EXPECT_NEAR(s[3], 0.25, 0.05);

    // Given speeds are the run's: measurements leave them.
    Dispatcher g(2, DispatchKind::Ready, {1, 0.5});
    g.add_call({{0, 0, 1.0}, {1, 0, 1.0}});
    g.add_call({{0, 0, 1.0}, {1, 0, 1.0}});
    EXPECT_EQ(g.speeds(), (std::vector<double>{1, 0.5}));
    EXPECT_TRUE(g.speeds_given());
}

TEST(Dispatcher, BadSpeedsAreRefused) {
    EXPECT_THROW(Dispatcher(2, DispatchKind::Ready, {1, 1, 1}), rp::Error);
    EXPECT_THROW(Dispatcher(2, DispatchKind::Ready, {1, 0}), rp::Error);
    EXPECT_THROW(Dispatcher(2, DispatchKind::Ready, {1, -1}), rp::Error);
    EXPECT_THROW(Dispatcher(0, DispatchKind::Ready), rp::Error);
    Dispatcher scaled(2, DispatchKind::Ready, {4, 2});  // relative: the fastest is 1
    EXPECT_EQ(scaled.speeds(), (std::vector<double>{1, 0.5}));
}
