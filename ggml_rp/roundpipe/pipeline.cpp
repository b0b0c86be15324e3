// The controller of the RoundPipe runtime (pipeline.h): plan, dispatch, step. The actors it drives live in
// device_worker, transfer, layer_protocol, host_store and optim/optimizer_thread.
#include "ggml_rp/roundpipe/pipeline.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/call_planner.h"
#include "ggml_rp/roundpipe/device_worker.h"
#include "ggml_rp/roundpipe/fault_report.h"
#include "ggml_rp/roundpipe/fuzz_delay.h"
#include "ggml_rp/roundpipe/host_store.h"
#include "ggml_rp/roundpipe/layer_protocol.h"
#include "ggml_rp/roundpipe/layer_timings.h"
#include "ggml_rp/roundpipe/speed_plans.h"
#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/runtime/work_queue.h"

#include <algorithm>
#include <deque>
#include <utility>

namespace rp {

struct Pipeline::Impl {
    TrainingProgram & prog;
    std::vector<Device *> devs;
    PipelineOptions opt;
    int L = 0;
    int G = 0;

    InvariantChecker checker;
    PipelineObserver none;
    PipelineObserver * observer = &none;
    FaultReport faults;
    std::shared_ptr<PinnedPool> pinned;     // the calls' pinned buffers, reused call after call
    HostStore store;
    LayerProtocol protocol;
    std::unique_ptr<LayerTimings> timings;  // EMA of measured per-layer times (§11.2)
    std::unique_ptr<CallPlanner> planner;   // plans that fit the devices (call_planner.h)
    std::deque<std::shared_ptr<Call>> unharvested;

    // Controller state.
    Dispatcher dispatcher;  // which device runs each RoundPipe job
    // Per layer: its class of equal work for the dispatcher's speed fit (layers of equal weight bytes: a
    // model's blocks), so that devices compare even when each stage always lands on the same device.
    std::vector<int> work_class;
    bool devices_idle = true;  // every device finished its jobs since the last call began (sync step, drain)
    std::deque<Assignment> assigned;   // the last kKeptAssignments jobs' devices
    std::vector<int64_t> jobs_run;     // per device, every job
    static constexpr size_t kKeptAssignments = 4096;
    int64_t calls = 0;
    int64_t calls_in_step = 0;
    CallPlan last;
    // A call's plan could not keep the frozen weights resident beside it: from then on no call does, so that
    // calls of changing shapes do not re-carve the devices and re-upload the model each time they alternate.
    bool stream_weights = false;
    HostFlag optim_updated{true};  // one update in flight at most
    int64_t flag_violations_at_start = 0;

    // The actors: destroyed workers first (they finish their jobs), then the optimizer thread.
    FuzzDelay optimizer_fuzz;
    std::unique_ptr<WorkQueue> optimizer;  // the optimizer thread
    std::vector<std::unique_ptr<DeviceWorker>> workers;

    Impl(TrainingProgram & p, std::vector<Device *> d, PipelineOptions o)
        : prog(p), devs(std::move(d)), opt(std::move(o)), pinned(PinnedPool::make(first_device(devs))),
          store(p, first_device(devs), opt.frozen_pinning.value_or(default_frozen_pinning(accelerators(devs))), /*share_masters=*/!opt.async),
          protocol(store.trainable_layers()), dispatcher(static_cast<int>(devs.size()), opt.dispatch, opt.device_speed) {
        L = prog.num_layers();
        G = static_cast<int>(devs.size());
        jobs_run.assign(static_cast<size_t>(G), 0);
        if (L < 2) throw Error("pipeline: the program needs at least 2 layers");
        if (opt.threads_per_device < 1) opt.threads_per_device = 1;
        if (opt.observer) observer = opt.observer;
        else if (opt.instrument) observer = &checker;
        // The checker's probes are host work that must run in stream order (hashing the uploaded weights,
        // querying marks when the weight stream gets there): only CPU virtual devices run launches so. A GPU
        // stream's launch runs on the host at once and would hash device pointers there.
        if (observer == &checker)
            for (Device * dev : devs)
                if (dev->stream(StreamKind::Compute).native_handle())
                    throw Error("pipeline: instrument (the invariant checker) needs CPU virtual devices; " + dev->name() +
                                " runs its streams on an accelerator");
        flag_violations_at_start = HostFlag::violations();
        if (opt.plan) validate_plan(*opt.plan, L);
        timings = std::make_unique<LayerTimings>(store.layer_bytes());
        for (size_t bytes : store.layer_bytes()) {
            const auto & lb = store.layer_bytes();
            work_class.push_back(static_cast<int>(std::find(lb.begin(), lb.end(), bytes) - lb.begin()));
        }
        planner = std::make_unique<CallPlanner>(prog, devs.front()->runner());

        if (opt.fuzz_seed) optimizer_fuzz = FuzzDelay(opt.fuzz_seed ^ 0x5bd1e995u, opt.fuzz_max_delay_us);
        optimizer = std::make_unique<WorkQueue>([this](const std::string & e) { faults.record("optimizer: " + e); },
                                                      [this] { optimizer_fuzz.sleep(); });
        const WorkerShared shared{prog, store, protocol, *observer, faults, opt.threads_per_device};
        for (int i = 0; i < G; ++i) {
            FuzzDelay fuzz;
            if (opt.fuzz_seed)
                fuzz = FuzzDelay(opt.fuzz_seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) + 1, opt.fuzz_max_delay_us);
            workers.push_back(std::make_unique<DeviceWorker>(i, *devs[static_cast<size_t>(i)], shared, fuzz));
        }
    }
    ~Impl() {
        workers.clear();
        optimizer.reset();
    }

    static Device & first_device(const std::vector<Device *> & d) {
        if (d.empty() || !d.front()) throw Error("pipeline: no devices");
        return *d.front();
    }
    // True when the devices run their streams on an accelerator (a native stream handle), not on host threads.
    static bool accelerators(const std::vector<Device *> & d) {
        for (Device * dev : d)
            if (dev && dev->stream(StreamKind::Compute).native_handle()) return true;
        return false;
    }

    CallPlanRequest request() const;
    CallPlan plan(const std::vector<MicroBatchInfo> & mbs);
    void harvest_timings();
    void dispatch(const std::shared_ptr<Job> & job, int device);
    std::vector<int> size_stages_by_speed(const std::vector<MicroBatchInfo> & info, bool idle, const CallPlanRequest & times, CallPlan & cp);
    // A call of these micro-batches planned, laid out and its jobs dispatched (forward_only: without the backward
    // stages, in evaluation mode, not timed); then, once its fused parts are done, each micro-batch's head results.
    std::shared_ptr<Call> start_call(const std::vector<MicroBatch> & mbs, bool forward_only);
    std::vector<std::vector<float>> head_results_of(Call & c);
};

// ---------------------------------------------------------------------------------------------------------
// Planning

CallPlanRequest Pipeline::Impl::request() const {
    CallPlanRequest r;
    r.schedule = opt.schedule;
    r.grain = opt.grain;
    r.plan = opt.plan;
    r.devices = G;
    r.token_chunk = opt.token_chunk;
    r.vocab_on_host = opt.vocab_on_host;
    r.resident = opt.resident_weights && !stream_weights;
    // Each device's capacity in whole buffer units (what run_plan plans with too: the same plans, the same bytes).
    auto usable = [](const Device * d) { return d->capacity() - d->capacity() % kBufferAlign; };
    r.device_memory = SIZE_MAX;
    bool mixed = false;
    for (Device * d : devs) {
        mixed = mixed || usable(d) != usable(devs.front());
        if (usable(d) < r.device_memory) {
            r.device_memory = usable(d);
            r.device_name = d->name();
        }
    }
    if (mixed)
        for (Device * d : devs) {
            r.device_memories.push_back(usable(d));
            r.device_names.push_back(d->name());
        }
    if (opt.layer_tf.size() == static_cast<size_t>(L) && opt.layer_tb.size() == static_cast<size_t>(L)) {
        r.tf = opt.layer_tf;
        r.tb = opt.layer_tb;
    } else {  // measured EMA once two calls have been timed, else the cold-start byte proxy
        r.tf = timings->forward();
        r.tb = timings->backward_stage();
    }
    return r;
}

CallPlan Pipeline::Impl::plan(const std::vector<MicroBatchInfo> & mbs) {
    const CallPlanRequest r = request();
    CallPlan cp = planner->plan(r, mbs);
    if (r.resident && planner->resident_bytes() > 0 && !cp.shape.resident) stream_weights = true;
    else if (!r.resident && stream_weights)
        cp.plan.notes.push_back("memory: the frozen weights did not fit beside an earlier call's plan: every job uploads its weights");
    return cp;
}

// Without blocking: the oldest calls whose timed launches have all completed feed the EMA, in call order, at
// speed 1 (each launch's time times its device's speed), and the dispatcher's measured speeds.
void Pipeline::Impl::harvest_timings() {
    while (!unharvested.empty()) {
        std::vector<Call::Timed> timed;
        if (!unharvested.front()->completed_timings(timed)) return;
        unharvested.pop_front();
        std::vector<double> fsum(static_cast<size_t>(L), 0), bsum(static_cast<size_t>(L), 0);
        std::vector<int> fn(static_cast<size_t>(L), 0), bn(static_cast<size_t>(L), 0);
        std::vector<Dispatcher::Launch> launches;
        try {
            for (const auto & t : timed) {
                const double measured = t.end->elapsed_ms(*t.start);
                launches.push_back({t.device, work_class[static_cast<size_t>(t.layer)] * 3 + static_cast<int>(t.kind), measured});
                const double ms = measured * dispatcher.speeds()[static_cast<size_t>(t.device)];
                const size_t l = static_cast<size_t>(t.layer);
                if (t.kind == Call::Launch::Forward) {
                    fsum[l] += ms;
                    ++fn[l];
                } else {
                    bsum[l] += ms;
                    ++bn[l];
                }
            }
        } catch (const Error &) {  // an event without timing (a failed job): skip this call
            continue;
        }
        std::vector<double> fwd(static_cast<size_t>(L), 0);
        std::vector<std::pair<LayerRange, double>> bwd;
        for (int l = 0; l < L; ++l) {
            const size_t li = static_cast<size_t>(l);
            const double b = bn[li] ? bsum[li] / bn[li] : 0.0;
            if (l == L - 1) {  // the head's program is forward + loss + backward: apportion as the byte proxy does
                fwd[li] = b / 3;
                bwd.push_back({{l, l + 1}, b - fwd[li]});
            } else {
                fwd[li] = fn[li] ? fsum[li] / fn[li] : 0.0;
                bwd.push_back({{l, l + 1}, std::max(0.0, b - fwd[li])});  // backward without its recompute
            }
        }
        timings->add_iteration(fwd, bwd);
        dispatcher.add_call(launches);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Dispatch (roundpipe.md §3.2): wait the per-layer flags the job needs, then the device's idle slot.

void Pipeline::Impl::dispatch(const std::shared_ptr<Job> & job, int device) {
    const LayerRange r = job->spec.layers;
    for (int l = r.begin; l < r.end; ++l) protocol.claim_upload(l);
    job->reupload.assign(static_cast<size_t>(r.size()), 0);
    if (job->spec.has_grads)
        for (int l = r.begin; l < r.end; ++l)
            if (protocol.trainable(l)) job->reupload[static_cast<size_t>(l - r.begin)] = protocol.claim_grad_slot(l);
    workers[static_cast<size_t>(device)]->submit(job);
}

// ---------------------------------------------------------------------------------------------------------

Pipeline::Pipeline(TrainingProgram & program, std::vector<Device *> devices, PipelineOptions options)
    : impl_(std::make_unique<Impl>(program, std::move(devices), std::move(options))) {}

Pipeline::~Pipeline() {
    try {
        synchronize();
    } catch (...) {  // the destructor must not throw; errors were reported by the calls that met them
    }
}

std::shared_ptr<Call> Pipeline::Impl::start_call(const std::vector<MicroBatch> & mbs, bool forward_only) {
    std::vector<MicroBatchInfo> info;
    for (const MicroBatch & m : mbs) info.push_back(m.info);
    CallPlan cp = plan(info);  // (a forward-only call takes a training call's plan: it needs no more)
    const bool idle = std::exchange(devices_idle, false);
    const CallPlanRequest times = request();
    const std::vector<int> bound = forward_only ? std::vector<int>{} : size_stages_by_speed(info, idle, times, cp);
    std::vector<MicroBatch> chunked = mbs;
    for (MicroBatch & m : chunked) {
        cp.apply(m.info);
        if (forward_only) m.info.training = false;  // evaluation mode: no dropout
    }
    auto c = std::make_shared<Call>(calls++, prog, *pinned, chunked, cp.plan);
    c->forward_only = forward_only;
    if (!forward_only) {  // (a forward-only call's launches are not timed for the planner: its head runs a third of the work)
        unharvested.push_back(c);
        while (unharvested.size() > 4) unharvested.pop_front();  // never hold more than a few calls' buffers
        last = cp;
    }
    std::vector<JobSpec> jobs = schedule_jobs(opt.schedule, c->plan, c->stages, c->M);
    if (forward_only) jobs = forward_only_jobs(std::move(jobs), c->stages);
    dispatcher.begin_call(idle);
    const CallModelInputs in{&c->info, &times.tf, &times.tb};
    for (size_t k = 0; k < jobs.size(); ++k) {
        const JobSpec & spec = jobs[k];
        auto job = std::make_shared<Job>();
        job->call = c;
        job->spec = spec;
        const int dev = spec.device >= 0 ? spec.device
                                         : model_job(dispatcher, c->stages, c->plan.grain, in, forward_only, spec,
                                                     bound.empty() ? -1 : bound[k], cp.devices_of_stage(spec.tasks.front().stage));
        job->shape = cp.shape_on(dev);
        job->memory = cp.regions_of(dev);
        assigned.push_back({c->id, spec.label, dev, spec.layers.size()});
        if (assigned.size() > kKeptAssignments) assigned.pop_front();
        ++jobs_run[static_cast<size_t>(dev)];
        dispatch(job, dev);
    }
    return c;
}

// Stage boundaries by speed (dispatch by readiness on devices of different speeds, a RoundPipe training call of
// the planner's plan; speed_plans.h): the plan sized by speed that the dispatcher's model finishes soonest is
// taken when it beats the planner's plan dispatched by readiness and its memory plan fits (else the next); then
// cp is its call plan and the result each job's device, else nothing changes and the result is empty.
std::vector<int> Pipeline::Impl::size_stages_by_speed(const std::vector<MicroBatchInfo> & info, bool idle,
                                                      const CallPlanRequest & times, CallPlan & cp) {
    if (opt.schedule != ScheduleKind::RoundPipe || opt.plan || dispatcher.kind() != DispatchKind::Ready || dispatcher.uniform() ||
        !cp.stage_devices.empty())  // (mixed memory that restricts stages: the planner's devices decide)
        return {};
    const CallModelInputs in{&info, &times.tf, &times.tb};
    const double by_readiness = predicted_call_end(dispatcher, idle, cp.plan, in);
    for (SpeedPlan & c : speed_plans(dispatcher, idle, cp.plan, in)) {
        if (c.end >= by_readiness) break;
        CallPlanRequest r = request();
        r.plan = c.plan;
        r.grain = c.plan.grain;  // (speed_plans may choose layer grain)
        try {
            CallPlan resized = planner->plan(r, info);
            // (never trade the residency for it, nor restrict stages to the larger devices)
            if (resized.shape.resident != cp.shape.resident || !resized.stage_devices.empty()) continue;
            cp = std::move(resized);
            return std::move(c.devices);
        } catch (const MemoryError &) {  // larger stages that do not fit
        }
    }
    return {};
}

std::vector<std::vector<float>> Pipeline::Impl::head_results_of(Call & c) {
    for (int i = 0; i < c.M; ++i) c.fused_done.acquire();
    std::vector<std::vector<float>> results;
    for (int i = 0; i < c.M; ++i) {
        const size_t mi = static_cast<size_t>(i);
        if (auto & ev = c.loss_ready[mi]) ev->synchronize();
        const float * r = c.loss.as<float>() + c.loss_at[mi];
        results.emplace_back(r, r + prog.head_results(c.info[mi]));
    }
    return results;
}

double Pipeline::forward_backward(const std::vector<MicroBatch> & mbs, std::vector<std::vector<float>> * head_results) {
    Impl & d = *impl_;
    rethrow_faults();
    if (mbs.empty()) throw Error("forward_backward: no micro-batches");
    d.harvest_timings();
    const std::shared_ptr<Call> c = d.start_call(mbs, false);
    ++d.calls_in_step;
    std::vector<std::vector<float>> results = d.head_results_of(*c);
    double loss = 0;
    for (const std::vector<float> & r : results) loss += r[0];
    rethrow_faults();
    if (head_results) *head_results = std::move(results);
    return loss;
}

std::vector<std::vector<float>> Pipeline::forward(const std::vector<MicroBatch> & mbs) {
    Impl & d = *impl_;
    rethrow_faults();
    if (mbs.empty()) throw Error("forward: no micro-batches");
    d.harvest_timings();  // (finished training calls' buffers back to the pool first)
    std::vector<std::vector<float>> results;
    {
        const std::shared_ptr<Call> c = d.start_call(mbs, true);
        results = d.head_results_of(*c);
    }
    // Sync steps: the forward-only call's buffers back to the pool before the next call (its jobs are done once
    // they are retired; async steps overlap calls and count two).
    if (!d.opt.async)
        for (auto & w : d.workers) w->release_calls();
    rethrow_faults();
    return results;
}

void Pipeline::step(std::function<void()> update) {
    Impl & d = *impl_;
    rethrow_faults();
    d.optim_updated.wait_and_clear();
    d.protocol.begin_step();
    const int64_t n = std::exchange(d.calls_in_step, 0);
    auto copy_back = [&d] { d.store.copy_back(d.protocol, [&d] { d.optimizer_fuzz.sleep(); }); };
    auto hand_off = [&d, n] { d.store.hand_off(d.protocol, *d.observer, n, [&d] { d.optimizer_fuzz.sleep(); }, d.opt.grads_complete); };
    auto upd = [update = std::move(update)] {
        if (update) update();
    };
    if (d.opt.async) {  // the copy-back publishes the previous update; this step's runs behind the next call
        d.optimizer->enqueue(copy_back);
        d.optimizer->enqueue(hand_off);
        d.optimizer->enqueue(upd);
        d.optimizer->enqueue([&d] { d.optim_updated.set(); });
    } else {
        d.optimizer->enqueue(hand_off);
        d.optimizer->enqueue(upd);
        d.optimizer->enqueue(copy_back);
        d.optimizer->enqueue([&d] { d.optim_updated.set(); });
        d.optim_updated.wait();
        d.devices_idle = true;  // the update waited for every gradient download: the devices are done
        // The finished calls' host buffers back to the pool before the next call takes its own: a sync run holds
        // one call's (run_plan.h counts it so).
        for (auto & w : d.workers) w->release_calls();
        rethrow_faults();
    }
}

void Pipeline::synchronize() {
    drain();
    impl_->store.refresh_working();
}

std::vector<std::vector<float>> Pipeline::working_weights() const {
    std::vector<std::vector<float>> w;
    const auto & params = impl_->prog.param_infos();
    for (size_t p = 0; p < params.size(); ++p) w.emplace_back(impl_->store.working(p), impl_->store.working(p) + params[p].n);
    return w;
}

const float * Pipeline::working_weight(size_t p) const { return impl_->store.working(p); }

void Pipeline::set_working_weights(const std::vector<std::vector<float>> & w) {
    const auto & params = impl_->prog.param_infos();
    if (w.size() != params.size()) throw Error("set_working_weights: " + std::to_string(w.size()) + " tensors for " + std::to_string(params.size()) + " parameters");
    for (size_t p = 0; p < params.size(); ++p) {
        if (w[p].size() != params[p].n) throw Error("set_working_weights: '" + params[p].name + "' has the wrong size");
        std::copy(w[p].begin(), w[p].end(), impl_->store.working(p));
    }
}

// Once anything failed, every device is synced before the first error is rethrown (FaultReport): a stream's
// fault is then on record, rather than only a program's error that was a consequence of it.
void Pipeline::rethrow_faults() {
    if (impl_->faults.failed()) drain();
}

void Pipeline::drain() {
    Impl & d = *impl_;
    d.devices_idle = true;
    d.optimizer->wait_idle();
    for (auto & w : d.workers) {
        w->wait_idle();
        try {
            w->device().synchronize();
        } catch (const std::exception & e) {
            d.faults.record(w->device().name() + ": " + e.what());
        }
    }
    d.faults.rethrow();
}

const Plan & Pipeline::last_plan() const { return impl_->last.plan; }

const DeviceMemoryPlan & Pipeline::last_memory() const { return impl_->last.memory; }

const FrozenPinningReport & Pipeline::frozen_pinning() const { return impl_->store.frozen_pinning(); }

size_t Pipeline::host_working_bytes() const { return impl_->store.working_bytes(); }

size_t Pipeline::host_slot_bytes() const { return impl_->store.slot_bytes(); }

const CallPlan & Pipeline::last_call() const { return impl_->last; }

CallPlan Pipeline::plan_call(const std::vector<MicroBatchInfo> & mbs) { return impl_->plan(mbs); }

DeviceMemoryPlan Pipeline::device_regions(int device) const {
    return impl_->workers.at(static_cast<size_t>(device))->regions();
}

DeviceMemoryPlan Pipeline::device_regions_used(int device) const {
    return impl_->workers.at(static_cast<size_t>(device))->regions_used();
}

size_t Pipeline::device_weight_bytes_uploaded(int device) const {
    return impl_->workers.at(static_cast<size_t>(device))->weight_bytes_uploaded();
}

int Pipeline::num_devices() const { return impl_->G; }

std::vector<Pipeline::Assignment> Pipeline::assignments() const { return {impl_->assigned.begin(), impl_->assigned.end()}; }

std::vector<double> Pipeline::device_speeds() const { return impl_->dispatcher.speeds(); }

std::vector<int64_t> Pipeline::jobs_per_device() const { return impl_->jobs_run; }

int Pipeline::timing_samples() const { return impl_->timings->samples(); }

PinnedPool::Stats Pipeline::pinned_stats() const { return impl_->pinned->stats(); }

PipelineChecks Pipeline::checks() const {
    PipelineChecks c = impl_->checker.checks();
    c.flag_violations = HostFlag::violations() - impl_->flag_violations_at_start;
    return c;
}

} // namespace rp
