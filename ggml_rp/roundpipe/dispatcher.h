// Which device runs the next RoundPipe job (issue #37): the paper's global round-robin pointer, or dispatch by
// readiness — the job goes to the device that would finish it first, so a slower device gets fewer jobs.
//
// The choice is made on a model, not on the devices' momentary state: each device's speed (given, or measured
// from its launches) and each job's per-micro-batch times at speed 1 (the planner's per-layer estimates) drive a
// small list-scheduling model of the chain of jobs — the controller hands a job over once the device's thread is
// idle (its third-last job complete: prefetch depth 1, §3.2), and a job's micro-batch m starts once the device
// finished its micro-batch m-1 (or its previous job) and the previous job of the call finished micro-batch m
// (§9.2). A job goes to the device on which it would finish first, ties in the pointer's order (choosing by the
// earliest start instead gives a slow device jobs it then holds the chain up with; preferring a device the
// controller need not wait for sends jobs to idle slow devices). So the assignment is a pure function of the
// speeds and estimates: reproducible, testable, and the controller still waits for the chosen device's idle
// slot exactly as before (prefetch depth 1 is the worker's). A device that slows down mid-run shows in its
// measured speed and gets fewer jobs from the next call on.
//
// Identical devices (every speed within kSameSpeed of the fastest) keep the round-robin pointer exactly: what
// the paper and today's runs do. Results never depend on the assignment (sync runs are bit-identical to the
// host for any assignment: tests/roundpipe/test_pipeline.cpp).
//
// Measured speeds: launches of one key do the same work (the pipeline's key: the kind of launch and the layer's
// class of equal weight bytes, so a model's blocks share keys across stages and devices). Each (key, device)
// pair keeps an EMA of its launches' times, and the model time = work(key) / speed(device) is fitted to the
// pairs seen in the last kWindowCalls calls in log space, each pair weighted by its time (alternating weighted
// least squares: a key's work is the weighted geometric mean of time x speed over its devices, a device's speed
// that of work / time over its keys; a long launch measures a device, a microsecond one the host's noise),
// relative to the fastest device. The first call is not used (start-up noise, as the planner's timings).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace rp {

enum class DispatchKind { RoundRobin, Ready };
// "round-robin" | "ready"; rp::Error naming the value otherwise.
DispatchKind dispatch_from_name(std::string_view name);
const char * dispatch_name(DispatchKind k);

class Dispatcher {
public:
    // Speeds within this fraction of the fastest count as equal (measurement noise must not reorder a uniform
    // machine's jobs).
    static constexpr double kSameSpeed = 0.15;
    static constexpr double kSmoothing = 0.5;  // EMA factor of a (key, device) pair's time
    static constexpr int kWindowCalls = 8;     // pairs not seen for longer are left out of the fit

    // given_speeds: each device's relative speed (> 0; scaled so the fastest is 1), fixed for the run; empty:
    // all 1 until measured. rp::Error on a count mismatch or a speed that is not positive and finite.
    Dispatcher(int devices, DispatchKind kind, std::vector<double> given_speeds = {});

    // The next job begins a new call: it waits on no job of this call. The call's dispatch begins when the
    // previous call returned (its fused job done), or, devices_idle (a sync step or a drain between), when every
    // device has finished: no device is free before that.
    void begin_call(bool devices_idle);
    // The device of the next job of the call, whose micro-batches take task_ms (speed 1, > 0 for the model to
    // order anything) each; the model's clock advances by the job on that device. fused: the job the call
    // returns after (FB). allowed[d]: device d may run the job (mixed memory: the devices that hold its stage;
    // the pointer then names the next allowed device); null: every device.
    int pick(const std::vector<double> & task_ms, bool fused = false, const std::vector<char> * allowed = nullptr);
    // The same for a job whose device was decided elsewhere (stages sized for the pointer's devices).
    void assign(int device, const std::vector<double> & task_ms, bool fused = false);
    // When the model's last job ends (compare two ways of running a call on copies of the dispatcher).
    double predicted_end() const;
    // The device the round-robin pointer names next.
    int pointer() const { return static_cast<int>(ptr_ % static_cast<uint64_t>(G_)); }
    // Every speed the same (within kSameSpeed): the pointer decides.
    bool uniform() const;

    // One call's timed launches: per launch, the device, a key naming what ran (layer and kind: launches of one
    // key do the same work) and the measured time. Ignored when the speeds were given.
    struct Launch {
        int device;
        int key;
        double ms;
    };
    void add_call(const std::vector<Launch> & launches);

    DispatchKind kind() const { return kind_; }
    bool speeds_given() const { return given_; }
    // The current speeds, the fastest 1 (snapped: within kSameSpeed of the fastest is 1).
    const std::vector<double> & speeds() const { return speeds_; }
    // Jobs picked per device since construction.
    const std::vector<int64_t> & jobs_per_device() const { return jobs_; }

private:
    struct Option {
        int device = -1;
        double handoff = 0;
        std::vector<double> ends;  // each micro-batch's end
        double finish() const { return ends.empty() ? handoff : ends.back(); }
    };
    Option option(int device, const std::vector<double> & task_ms) const;
    int commit(Option o, bool fused);
    void set_speeds(std::vector<double> raw);
    void fit_speeds();

    int G_;
    DispatchKind kind_;
    bool given_;
    std::vector<double> speeds_;
    struct Pair {
        double ms = 0;      // EMA of the launches' times
        int last_call = -1; // the call that last updated it (-1: never)
    };
    std::vector<std::vector<Pair>> pairs_;  // [key][device]
    int calls_seen_ = 0;
    uint64_t ptr_ = 0;              // the round-robin pointer
    std::vector<double> free_;      // model: when each device finishes its last job
    std::vector<double> prev_end_;  // model: the end of each micro-batch of the call's previous job
    double fused_end_ = 0;          // model: when the last call's fused job ended
    double ctl_ = 0;                // model: when the controller handed over the last job
    std::vector<std::array<double, 3>> recent_;  // model: each device's last three jobs' ends, oldest first
    std::vector<int64_t> jobs_;
};

} // namespace rp
