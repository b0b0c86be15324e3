#include "ggml_rp/roundpipe/pipeline.h"

#include "ggml_rp/roundpipe/layer_timings.h"
#include "ggml_rp/roundpipe/planner.h"
#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/roundpipe/transfer.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/graph_runner.h"
#include "gguf/error.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace rp {

ScheduleKind schedule_from_name(std::string_view name) {
    if (name == "roundpipe") return ScheduleKind::RoundPipe;
    if (name == "gpipe") return ScheduleKind::GPipe;
    if (name == "1f1b") return ScheduleKind::OneFOneB;
    throw Error("--schedule: unknown schedule '" + std::string(name) + "' (roundpipe, gpipe or 1f1b)");
}

const char * schedule_name(ScheduleKind k) {
    switch (k) {
    case ScheduleKind::RoundPipe: return "roundpipe";
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    }
    return "?";
}

Plan bound_plan(int num_layers, int num_devices, RecomputeGrain grain) {
    if (num_devices < 1) throw Error("bound_plan: need at least one device");
    const int G = std::min(num_devices, num_layers);
    std::vector<int> sizes(static_cast<size_t>(G), num_layers / G);
    for (int i = 0; i < num_layers % G; ++i) ++sizes[static_cast<size_t>(i)];
    std::vector<int> fwd(sizes.begin(), sizes.end() - 1), bwd = {sizes.back()};
    for (int i = G - 2; i >= 0; --i) bwd.push_back(sizes[static_cast<size_t>(i)]);
    return plan_from_sizes(fwd, bwd, grain);
}

namespace {

enum class Pass { Fwd, Fused, Bwd };

struct StageDesc {
    Pass pass;
    LayerRange layers;
    std::string name;  // "F2", "FB", "B3"
    std::string cat;   // "fwd/F2", "fused/FB", "bwd/B3"
};

uint64_t fnv1a(const void * p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const auto * b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// One forward_backward call: its micro-batches, plan, host activations, semaphores and readiness events.
// Shared by the jobs (device threads may still enqueue its last backward stages after the call returned).
struct Call {
    int64_t id = 0;
    int M = 0;
    std::vector<MicroBatchInfo> info;
    std::vector<PinnedBuffer> ids, labels;  // pinned copies of the caller's tokens
    size_t max_hidden = 0, max_tokens = 0;
    Plan plan;
    std::vector<StageDesc> stages;
    int fb = 0;                              // index of FB in stages
    std::vector<std::unique_ptr<Semaphore>> sem;  // per stage, released once per micro-batch
    Semaphore fused_done;                    // the controller's count of finished fused parts
    std::vector<char> need_act;              // per layer: its input is kept on the host
    std::vector<std::vector<PinnedBuffer>> act, dact;  // [layer][mb]: input of the layer / its gradient
    std::vector<std::vector<std::shared_ptr<Event>>> act_ready, dact_ready;  // recorded after the D2H
    PinnedBuffer loss;
    std::vector<std::shared_ptr<Event>> loss_ready;

    // Event pairs around every program launch, harvested for the planner once they have all completed (§11.2).
    struct Timed {
        int layer;
        int kind;  // 0 forward (or recompute), 1 recompute + backward, 2 the head's fused program
        std::shared_ptr<Event> start, end;
    };
    std::mutex timed_m;
    std::vector<Timed> timed;
};

struct Task {
    int stage;
    int mb;
};

struct Job {
    std::shared_ptr<Call> call;
    LayerRange range;
    std::vector<Task> tasks;
    bool has_grads = false;
    std::vector<char> reupload;  // per layer of range: the staging buffer holds this step's running sum
    std::string label;
};

// Per-layer protocol state (§9.1).
struct LayerSync {
    HostFlag param_copied{true};
    HostFlag param_upload_started{true};
    HostFlag grad_download_started{true};
    HostFlag grad_copied{true};
    bool host_grad_pending = false;  // controller only
    bool trainable = false;

    std::mutex m;
    std::vector<std::shared_ptr<Event>> uploads;  // weight uploads since the last copy-back
    std::shared_ptr<Event> grad_downloaded;

    void add_upload(std::shared_ptr<Event> ev) {
        std::lock_guard<std::mutex> lk(m);
        uploads.push_back(std::move(ev));
    }
    std::vector<std::shared_ptr<Event>> take_uploads() {
        std::lock_guard<std::mutex> lk(m);
        return std::exchange(uploads, {});
    }
    void set_grad_downloaded(std::shared_ptr<Event> ev) {
        std::lock_guard<std::mutex> lk(m);
        grad_downloaded = std::move(ev);
    }
    std::shared_ptr<Event> last_grad_download() {
        std::lock_guard<std::mutex> lk(m);
        return grad_downloaded;
    }
};

// Memory of a finished job, freed once its last download-stream event has completed; it also keeps the call
// (whose pinned host buffers the job's copies read and write) alive until then.
struct Retired {
    std::shared_ptr<Event> done;
    std::vector<void *> buffers;
    std::shared_ptr<Call> call;
};

struct Worker {
    Device * dev = nullptr;
    int index = 0;
    std::thread thread;
    Semaphore idle{1};
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Job>> queue;
    bool stop = false;
    bool busy = false;
    std::deque<Retired> retired;
    std::deque<std::shared_ptr<Event>> marks;  // activation-upload marks, oldest first
    std::mt19937_64 fuzz;
};

// Activation buffers of one stage for one micro-batch parity (a ring of two per stage per job).
struct ActSet {
    std::vector<void *> in;     // fwd/fused: [0]; bwd: one per checkpoint (stage grain: 1; layer grain: per layer)
    std::vector<void *> work;   // hidden buffers: layer outputs (fwd), layer inputs (fused / bwd recompute)
    void * labels = nullptr;
    void * dout = nullptr;
    void * d[2] = {nullptr, nullptr};
    float * loss = nullptr;
    std::shared_ptr<Event> free;  // the last D2H of the micro-batch that used it
};

} // namespace

struct Pipeline::Impl {
    TrainingProgram & prog;
    std::vector<Device *> devs;
    PipelineOptions opt;
    int L = 0;
    int G = 0;

    // ---- host store ----
    std::vector<PinnedBuffer> working;                // per param: the f32 working copy devices read
    std::vector<std::vector<PinnedBuffer>> staging;   // [layer][tensor]: pinned grad slot (trainable only)
    std::vector<std::unique_ptr<LayerSync>> sync;
    std::vector<size_t> layer_bytes, layer_train_bytes;

    // ---- actors ----
    std::vector<std::unique_ptr<Worker>> workers;
    uint64_t rr = 0;  // the global round-robin pointer
    std::thread opt_thread;
    std::mutex opt_m;
    std::condition_variable opt_cv;
    std::deque<std::function<void()>> opt_queue;
    bool opt_stop = false;
    bool opt_busy = false;
    HostFlag optim_updated{true};
    std::mt19937_64 opt_fuzz;

    // ---- planner timings (EMA of measured per-layer times, roundpipe.md §11.2) ----
    std::unique_ptr<LayerTimings> timings;
    std::deque<std::shared_ptr<Call>> unharvested;

    // ---- state ----
    int64_t calls = 0;
    int64_t calls_in_step = 0;
    Plan last_plan;
    std::mutex err_m;
    std::string first_error;
    std::atomic<bool> failed{false};

    // ---- instrumentation ----
    mutable std::mutex inst_m;
    PipelineChecks checks;
    int64_t flag_violations_at_start = 0;
    std::map<std::pair<int64_t, int>, std::vector<uint64_t>> weight_hashes;  // (call, layer) -> hash per upload
    std::vector<std::vector<int64_t>> downloads;                             // [layer][tensor] this step

    Impl(TrainingProgram & p, std::vector<Device *> d, PipelineOptions o);
    ~Impl();

    void record_error(const std::string & what) {
        std::lock_guard<std::mutex> lk(err_m);
        if (first_error.empty()) first_error = what;
        failed.store(true);
    }
    void throw_if_failed() {
        if (!failed.load()) return;
        std::lock_guard<std::mutex> lk(err_m);
        throw Error("pipeline: " + first_error);
    }
    void fuzz_sleep(std::mt19937_64 & rng) {
        if (!opt.fuzz_seed || opt.fuzz_max_delay_us <= 0) return;
        const double us = static_cast<double>(rng() >> 11) * 0x1.0p-53 * opt.fuzz_max_delay_us;
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
    }
    // Runs a program on a device's compute stream; an exception is recorded, then poisons the stream.
    void launch(Worker & w, OpLabel label, std::function<void()> fn) {
        w.dev->stream(StreamKind::Compute).launch(std::move(label), [this, fn = std::move(fn)] {
            try {
                fn();
            } catch (const std::exception & e) {
                record_error(e.what());
                throw;
            }
        });
    }
    // A program launch between two compute-stream events that the planner's timings read later.
    void timed_launch(Worker & w, Call & c, int layer, int kind, OpLabel label, std::function<void()> fn) {
        std::shared_ptr<Event> a = record(w, StreamKind::Compute);
        launch(w, std::move(label), std::move(fn));
        std::shared_ptr<Event> b = record(w, StreamKind::Compute);
        std::lock_guard<std::mutex> lk(c.timed_m);
        c.timed.push_back({layer, kind, std::move(a), std::move(b)});
    }
    std::shared_ptr<Event> record(Worker & w, StreamKind s) {
        std::shared_ptr<Event> ev = w.dev->create_event();
        w.dev->stream(s).record(*ev);
        return ev;
    }

    std::shared_ptr<Call> make_call(const std::vector<MicroBatch> & mbs);
    Plan choose_plan() const;
    void harvest_timings();
    std::vector<std::shared_ptr<Job>> make_jobs(const std::shared_ptr<Call> & c) const;
    void dispatch(const std::shared_ptr<Job> & job, int device);

    void worker_loop(Worker & w);
    void retire(Worker & w, size_t keep);
    void * alloc(Worker & w, size_t bytes, const std::string & what, std::vector<void *> & owned);
    void run_job(Worker & w, Job & job, std::vector<char> & released);
    void upload_weights(Worker & w, Job & job, const std::vector<LayerMemory> & mem, const std::string & cat);
    void run_task(Worker & w, Job & job, const Task & t, std::vector<LayerMemory> & mem, ActSet & s);

    void opt_loop();
    void enqueue_opt(std::function<void()> fn);
    void copy_back();
    void hand_off(int64_t n_calls);
};

Pipeline::Impl::Impl(TrainingProgram & p, std::vector<Device *> d, PipelineOptions o)
    : prog(p), devs(std::move(d)), opt(std::move(o)) {
    L = prog.num_layers();
    G = static_cast<int>(devs.size());
    if (G < 1) throw Error("pipeline: no devices");
    if (L < 2) throw Error("pipeline: the program needs at least 2 layers");
    if (opt.threads_per_device < 1) opt.threads_per_device = 1;
    flag_violations_at_start = HostFlag::violations();

    // Host store: working copies of the trainable tensors, one pinned grad slot per (layer, trainable tensor).
    const auto & params = prog.params();
    for (const auto & pi : params) {
        working.emplace_back(*devs.front(), pi.n * sizeof(float));
        std::memcpy(working.back().data(), pi.master, pi.n * sizeof(float));
    }
    staging.resize(static_cast<size_t>(L));
    downloads.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
        auto ls = std::make_unique<LayerSync>();
        size_t bytes = 0, train = 0;
        for (const auto & ti : prog.layer_tensors(l)) {
            bytes += ti.bytes;
            if (ti.param >= 0) {
                if (ti.param >= static_cast<int>(params.size()) || params[static_cast<size_t>(ti.param)].n * sizeof(float) != ti.bytes)
                    throw Error("pipeline: tensor '" + ti.name + "' of layer " + prog.layer_name(l) + " does not match its parameter");
                train += ti.bytes;
                ls->trainable = true;
                staging[static_cast<size_t>(l)].emplace_back(*devs.front(), ti.bytes);
            } else {
                if (!ti.host) throw Error("pipeline: frozen tensor '" + ti.name + "' has no host data");
                staging[static_cast<size_t>(l)].emplace_back();
            }
        }
        downloads[static_cast<size_t>(l)].assign(prog.layer_tensors(l).size(), 0);
        layer_bytes.push_back(bytes);
        layer_train_bytes.push_back(train);
        sync.push_back(std::move(ls));
    }
    if (opt.plan) validate_plan(*opt.plan, L);
    timings = std::make_unique<LayerTimings>(layer_bytes);

    for (int i = 0; i < G; ++i) {
        auto w = std::make_unique<Worker>();
        w->dev = devs[static_cast<size_t>(i)];
        w->index = i;
        w->fuzz.seed(opt.fuzz_seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) + 1);
        workers.push_back(std::move(w));
    }
    opt_fuzz.seed(opt.fuzz_seed ^ 0x5bd1e995u);
    for (auto & w : workers) {
        Worker * wp = w.get();
        wp->thread = std::thread([this, wp] { worker_loop(*wp); });
    }
    opt_thread = std::thread([this] { opt_loop(); });
}

Pipeline::Impl::~Impl() {
    for (auto & w : workers) {
        {
            std::lock_guard<std::mutex> lk(w->m);
            w->stop = true;
        }
        w->cv.notify_all();
    }
    for (auto & w : workers)
        if (w->thread.joinable()) w->thread.join();
    {
        std::lock_guard<std::mutex> lk(opt_m);
        opt_stop = true;
    }
    opt_cv.notify_all();
    if (opt_thread.joinable()) opt_thread.join();
    for (auto & w : workers) {
        try {
            w->dev->synchronize();
        } catch (...) {  // already recorded
        }
        retire(*w, 0);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Controller

Plan Pipeline::Impl::choose_plan() const {
    if (opt.schedule != ScheduleKind::RoundPipe) return bound_plan(L, G, opt.grain);
    if (opt.plan) return *opt.plan;
    PlannerInput in;
    if (opt.layer_tf.size() == static_cast<size_t>(L) && opt.layer_tb.size() == static_cast<size_t>(L)) {
        in.tf = opt.layer_tf;
        in.tb = opt.layer_tb;
    } else {  // measured EMA once two calls have been timed, else the cold-start byte proxy
        in.tf = timings->forward();
        in.tb = timings->backward_stage();
    }
    in.mf = layer_bytes;
    for (int l = 0; l < L; ++l) in.mb.push_back(layer_bytes[static_cast<size_t>(l)] + layer_train_bytes[static_cast<size_t>(l)]);
    size_t cap = SIZE_MAX;
    for (Device * d : devs) cap = std::min(cap, d->capacity());
    in.device_memory = cap;
    in.memory_limit = static_cast<size_t>(opt.memory_fraction * static_cast<double>(cap));
    in.min_stages = G;
    in.grain = opt.grain;
    for (int l = 0; l < L; ++l) in.layer_names.push_back(prog.layer_name(l));
    return make_plan(in);
}

// Without blocking: the oldest calls whose timed launches have all completed feed the EMA, in call order.
void Pipeline::Impl::harvest_timings() {
    while (!unharvested.empty()) {
        std::vector<Call::Timed> timed;
        {
            Call & c = *unharvested.front();
            std::lock_guard<std::mutex> lk(c.timed_m);
            for (const auto & t : c.timed)
                if (!t.end->query()) return;
            timed = c.timed;
        }  // unlocked before the call may be destroyed
        unharvested.pop_front();
        std::vector<double> fsum(static_cast<size_t>(L), 0), bsum(static_cast<size_t>(L), 0);
        std::vector<int> fn(static_cast<size_t>(L), 0), bn(static_cast<size_t>(L), 0);
        try {
            for (const auto & t : timed) {
                const double ms = t.end->elapsed_ms(*t.start);
                const size_t l = static_cast<size_t>(t.layer);
                if (t.kind == 0) {
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
    }
}

std::shared_ptr<Call> Pipeline::Impl::make_call(const std::vector<MicroBatch> & mbs) {
    auto c = std::make_shared<Call>();
    c->id = calls++;
    c->M = static_cast<int>(mbs.size());
    Device & host = *devs.front();
    for (const MicroBatch & mb : mbs) {
        if (!mb.ids || !mb.labels || mb.info.seq_len < 1 || mb.info.n_seq < 1)
            throw Error("forward_backward: a micro-batch has no tokens");
        c->info.push_back(mb.info);
        const size_t tb = prog.token_bytes(mb.info);
        c->ids.emplace_back(host, tb);
        std::memcpy(c->ids.back().data(), mb.ids, tb);
        c->labels.emplace_back(host, tb);
        std::memcpy(c->labels.back().data(), mb.labels, tb);
        c->max_tokens = std::max(c->max_tokens, tb);
        c->max_hidden = std::max(c->max_hidden, prog.hidden_bytes(mb.info));
    }
    c->plan = choose_plan();
    validate_plan(c->plan, L);
    const Plan & p = c->plan;
    for (size_t i = 0; i < p.fwd.size(); ++i)
        c->stages.push_back({Pass::Fwd, p.fwd[i], std::string("F").append(std::to_string(i)), std::string("fwd/F").append(std::to_string(i))});
    c->fb = static_cast<int>(c->stages.size());
    c->stages.push_back({Pass::Fused, p.bwd[0], "FB", "fused/FB"});
    for (size_t i = 1; i < p.bwd.size(); ++i)
        c->stages.push_back({Pass::Bwd, p.bwd[i], std::string("B").append(std::to_string(i)), std::string("bwd/B").append(std::to_string(i))});
    for (size_t i = 0; i < c->stages.size(); ++i) c->sem.push_back(std::make_unique<Semaphore>(0));

    // Host activations: every forward stage's output, plus the checkpoints the backward stages start from.
    c->need_act.assign(static_cast<size_t>(L), 0);
    std::vector<char> need_dact(static_cast<size_t>(L), 0);
    for (const LayerRange & r : p.fwd) c->need_act[static_cast<size_t>(r.end)] = 1;
    for (size_t i = 1; i < p.bwd.size(); ++i) {
        const LayerRange & r = p.bwd[i];
        if (p.grain == RecomputeGrain::Layer)
            for (int l = r.begin; l < r.end; ++l) c->need_act[static_cast<size_t>(l)] = 1;
        else
            c->need_act[static_cast<size_t>(r.begin)] = 1;
    }
    for (const LayerRange & r : p.bwd) need_dact[static_cast<size_t>(r.begin)] = 1;
    c->need_act[0] = 0;  // layer 0's input is the token ids
    need_dact[0] = 0;
    c->act.resize(static_cast<size_t>(L));
    c->dact.resize(static_cast<size_t>(L));
    c->act_ready.resize(static_cast<size_t>(L));
    c->dact_ready.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
        const size_t li = static_cast<size_t>(l);
        c->act_ready[li].resize(static_cast<size_t>(c->M));
        c->dact_ready[li].resize(static_cast<size_t>(c->M));
        for (int i = 0; i < c->M; ++i) {
            const size_t hb = prog.hidden_bytes(c->info[static_cast<size_t>(i)]);
            if (c->need_act[li]) c->act[li].emplace_back(host, hb);
            if (need_dact[li]) c->dact[li].emplace_back(host, hb);
        }
    }
    c->loss = PinnedBuffer(host, sizeof(float) * static_cast<size_t>(c->M));
    c->loss_ready.resize(static_cast<size_t>(c->M));
    return c;
}

std::vector<std::shared_ptr<Job>> Pipeline::Impl::make_jobs(const std::shared_ptr<Call> & c) const {
    std::vector<std::shared_ptr<Job>> jobs;
    auto job = [&](LayerRange range, std::string label) {
        auto j = std::make_shared<Job>();
        j->call = c;
        j->range = range;
        j->label = std::move(label);
        jobs.push_back(j);
        return j;
    };
    const int M = c->M;
    if (opt.schedule == ScheduleKind::RoundPipe) {
        for (int s = 0; s < static_cast<int>(c->stages.size()); ++s) {
            const StageDesc & sd = c->stages[static_cast<size_t>(s)];
            auto j = job(sd.layers, sd.name);
            for (int i = 0; i < M; ++i) j->tasks.push_back({s, i});
            j->has_grads = sd.pass != Pass::Fwd;
        }
        return jobs;
    }
    // Bound schedules: device d holds range d for the whole call. Stage table: F0..F(G'-2), FB, B1..B(G'-1)
    // where B_k covers range G'-1-k.
    const int Gb = static_cast<int>(c->plan.fwd.size()) + 1;
    for (int d = 0; d < Gb; ++d) {
        const bool last = d == Gb - 1;
        const int fs = d, bs = last ? c->fb : c->fb + (Gb - 1 - d);
        auto j = job(c->stages[static_cast<size_t>(last ? c->fb : fs)].layers, std::string("dev").append(std::to_string(d)));
        j->has_grads = true;
        if (last) {
            for (int i = 0; i < M; ++i) j->tasks.push_back({c->fb, i});
        } else if (opt.schedule == ScheduleKind::GPipe) {
            for (int i = 0; i < M; ++i) j->tasks.push_back({fs, i});
            for (int i = 0; i < M; ++i) j->tasks.push_back({bs, i});
        } else {  // 1F1B: warm-up forwards, then one forward + one backward, then the remaining backwards
            const int warm = std::min(Gb - 1 - d, M);
            int f = 0, b = 0;
            for (; f < warm; ++f) j->tasks.push_back({fs, f});
            while (b < M) {
                if (f < M) j->tasks.push_back({fs, f++});
                j->tasks.push_back({bs, b++});
            }
        }
    }
    return jobs;
}

void Pipeline::Impl::dispatch(const std::shared_ptr<Job> & job, int device) {
    Job & j = *job;
    for (int l = j.range.begin; l < j.range.end; ++l) {
        LayerSync & ls = *sync[static_cast<size_t>(l)];
        ls.param_copied.wait();
        ls.param_upload_started.wait_and_clear();
    }
    j.reupload.assign(static_cast<size_t>(j.range.size()), 0);
    if (j.has_grads)
        for (int l = j.range.begin; l < j.range.end; ++l) {
            LayerSync & ls = *sync[static_cast<size_t>(l)];
            if (!ls.trainable) continue;
            ls.grad_copied.wait();
            ls.grad_download_started.wait_and_clear();
            if (auto ev = ls.last_grad_download()) ev->synchronize();  // edge 6: the previous D2H is complete
            j.reupload[static_cast<size_t>(l - j.range.begin)] = ls.host_grad_pending;
            ls.host_grad_pending = true;
        }
    Worker & w = *workers[static_cast<size_t>(device)];
    w.idle.acquire();
    {
        std::lock_guard<std::mutex> lk(w.m);
        w.queue.push_back(job);
    }
    w.cv.notify_all();
}

// ---------------------------------------------------------------------------------------------------------
// Device threads

void Pipeline::Impl::worker_loop(Worker & w) {
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lk(w.m);
            w.cv.wait(lk, [&] { return w.stop || !w.queue.empty(); });
            if (w.queue.empty()) return;
            job = w.queue.front();
            w.queue.pop_front();
            w.busy = true;
        }
        std::vector<char> released(job->tasks.size(), 0);
        try {
            run_job(w, *job, released);
        } catch (const std::exception & e) {
            record_error(w.dev->name() + ": job " + job->label + ": " + e.what());
            // Keep every other thread moving: release what this job still owed.
            for (size_t k = 0; k < job->tasks.size(); ++k)
                if (!released[k]) {
                    const Task & t = job->tasks[k];
                    job->call->sem[static_cast<size_t>(t.stage)]->release();
                    if (t.stage == job->call->fb) job->call->fused_done.release();
                }
            for (int l = job->range.begin; l < job->range.end; ++l) {
                LayerSync & ls = *sync[static_cast<size_t>(l)];
                if (!ls.param_upload_started.is_set()) ls.param_upload_started.set();
                if (job->has_grads && ls.trainable && !ls.grad_download_started.is_set()) ls.grad_download_started.set();
            }
        }
        {
            std::lock_guard<std::mutex> lk(w.m);
            w.busy = false;
        }
        w.cv.notify_all();
        w.idle.release();
    }
}

void Pipeline::Impl::retire(Worker & w, size_t keep) {
    while (w.retired.size() > keep) {
        Retired r = std::move(w.retired.front());
        w.retired.pop_front();
        if (r.done) r.done->synchronize();
        for (void * p : r.buffers) w.dev->free(p);
    }
}

void * Pipeline::Impl::alloc(Worker & w, size_t bytes, const std::string & what, std::vector<void *> & owned) {
    void * p = nullptr;
    try {
        p = w.dev->allocate(bytes, what);
    } catch (const Error &) {
        retire(w, 0);  // the previous job may still hold memory: wait for it, then try once more
        p = w.dev->allocate(bytes, what);
    }
    owned.push_back(p);
    return p;
}

void Pipeline::Impl::upload_weights(Worker & w, Job & job, const std::vector<LayerMemory> & mem, const std::string & cat) {
    Stream & ws = w.dev->stream(StreamKind::WeightUpload);
    // Activations first: the marks of activation uploads still pending on this device.
    while (!w.marks.empty() && w.marks.front()->query()) w.marks.pop_front();
    std::vector<std::shared_ptr<Event>> pending(w.marks.begin(), w.marks.end());

    struct Src {
        const void * host;
        void * dev;
    };
    std::vector<Src> srcs;
    std::vector<size_t> sizes;
    for (int l = job.range.begin; l < job.range.end; ++l) {
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i) {
            const void * host = ts[i].param >= 0 ? working[static_cast<size_t>(ts[i].param)].data() : ts[i].host;
            srcs.push_back({host, mem[static_cast<size_t>(l - job.range.begin)].data[i]});
            sizes.push_back(ts[i].bytes);
        }
    }
    const auto groups = lpt_groups(split_chunks(sizes), static_cast<int>(pending.size()));
    for (size_t g = 0; g < groups.size(); ++g) {
        if (g < pending.size()) {
            ws.wait(*pending[g]);
            if (opt.instrument) {
                std::vector<std::shared_ptr<Event>> before(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(g + 1));
                ws.launch(OpLabel("check W " + job.label, cat), [this, before] {
                    int64_t bad = 0;
                    for (const auto & ev : before) bad += ev->query() ? 0 : 1;
                    std::lock_guard<std::mutex> lk(inst_m);
                    checks.priority_violations += bad;
                    ++checks.weight_groups_checked;
                });
            }
        }
        for (const CopyChunk & ch : groups[g]) {
            const Src & s = srcs[static_cast<size_t>(ch.tensor)];
            ws.copy(static_cast<char *>(s.dev) + ch.offset, static_cast<const char *>(s.host) + ch.offset, ch.bytes,
                    CopyKind::HostToDevice, OpLabel("W " + job.label, cat));
        }
    }
    // Accumulated gradients of an earlier call of this step go back up with the weights (§5).
    Stream & cs = w.dev->stream(StreamKind::Compute);
    for (int l = job.range.begin; l < job.range.end && job.has_grads; ++l) {
        const size_t k = static_cast<size_t>(l - job.range.begin);
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i) {
            if (ts[i].param < 0) continue;
            if (job.reupload[k])
                ws.copy(mem[k].grad[i], staging[static_cast<size_t>(l)][i].data(), ts[i].bytes, CopyKind::HostToDevice,
                        OpLabel("G up " + job.label, cat));
            else
                cs.launch(OpLabel("G zero " + job.label, cat), [dev = w.dev, p = mem[k].grad[i], n = ts[i].bytes] { zero_device_memory(*dev, p, n); });
        }
    }
    std::shared_ptr<Event> up = record(w, StreamKind::WeightUpload);
    for (int l = job.range.begin; l < job.range.end; ++l) {
        LayerSync & ls = *sync[static_cast<size_t>(l)];
        ls.add_upload(up);
        ls.param_upload_started.set();
    }
    cs.wait(*up);
    if (opt.instrument) {  // I4: the bytes this job computes with, per layer
        const int64_t call_id = job.call->id;
        for (int l = job.range.begin; l < job.range.end; ++l) {
            const auto & ts = prog.layer_tensors(l);
            std::vector<std::pair<const void *, size_t>> spans;
            for (size_t i = 0; i < ts.size(); ++i) spans.emplace_back(mem[static_cast<size_t>(l - job.range.begin)].data[i], ts[i].bytes);
            cs.launch(OpLabel("hash " + job.label, cat), [this, spans, call_id, l] {
                uint64_t h = 0xcbf29ce484222325ull;
                for (const auto & s : spans) h = fnv1a(s.first, s.second, h);
                std::lock_guard<std::mutex> lk(inst_m);
                weight_hashes[{call_id, l}].push_back(h);
                ++checks.weight_uploads_hashed;
            });
        }
    }
    // Prefetch depth 1: the next upload on this device may overlap this job's compute, never the previous one's.
    std::shared_ptr<Event> tail = record(w, StreamKind::Compute);
    ws.wait(*tail);
}

void Pipeline::Impl::run_job(Worker & w, Job & job, std::vector<char> & released) {
    Call & c = *job.call;
    retire(w, 1);  // at most two jobs' memory on a device: this one and the previous
    std::vector<void *> owned;
    size_t job_bytes = 0;
    auto take = [&](size_t bytes, const std::string & what) {
        job_bytes += (bytes + 255) / 256 * 256;  // as the arena rounds
        return alloc(w, bytes, what, owned);
    };

    // Weights and gradient buffers of the job's layers.
    std::vector<LayerMemory> mem(static_cast<size_t>(job.range.size()));
    for (int l = job.range.begin; l < job.range.end; ++l) {
        LayerMemory & lm = mem[static_cast<size_t>(l - job.range.begin)];
        for (const auto & ti : prog.layer_tensors(l)) {
            lm.data.push_back(take(ti.bytes, ti.name));
            lm.grad.push_back(job.has_grads && ti.param >= 0 ? static_cast<float *>(take(ti.bytes, ti.name + " grad")) : nullptr);
        }
    }

    // Activation buffers: a ring of two sets per stage this job runs.
    std::map<int, std::array<ActSet, 2>> sets;
    for (const Task & t : job.tasks) {
        if (sets.count(t.stage)) continue;
        const StageDesc & sd = c.stages[static_cast<size_t>(t.stage)];
        const int a = sd.layers.begin, b = sd.layers.end, k = sd.layers.size();
        const size_t H = c.max_hidden, I = c.max_tokens;
        auto & ring = sets[t.stage];
        for (ActSet & s : ring) {
            const std::string tag = "activations " + sd.name;
            switch (sd.pass) {
            case Pass::Fwd:
                s.in.push_back(take(a == 0 ? I : H, tag));
                for (int i = 0; i < k; ++i) s.work.push_back(take(H, tag));
                break;
            case Pass::Fused:
                s.in.push_back(take(a == 0 ? I : H, tag));
                s.labels = take(I, tag);
                for (int i = 1; i < k; ++i) s.work.push_back(take(H, tag));  // inputs of layers a+1 .. L-1
                s.d[0] = take(H, tag);
                s.d[1] = take(H, tag);
                s.loss = static_cast<float *>(take(sizeof(float), tag));
                break;
            case Pass::Bwd:
                if (c.plan.grain == RecomputeGrain::Layer) {
                    for (int l = a; l < b; ++l) s.in.push_back(take(l == 0 ? I : H, tag));
                } else {
                    s.in.push_back(take(a == 0 ? I : H, tag));
                    for (int i = 1; i < k; ++i) s.work.push_back(take(H, tag));
                }
                s.dout = take(H, tag);
                s.d[0] = take(H, tag);
                s.d[1] = take(H, tag);
                break;
            }
        }
    }
    {
        std::lock_guard<std::mutex> lk(inst_m);
        checks.max_job_bytes = std::max(checks.max_job_bytes, job_bytes);
    }

    const std::string cat0 = c.stages[static_cast<size_t>(job.tasks.front().stage)].cat;
    upload_weights(w, job, mem, cat0);

    for (size_t k = 0; k < job.tasks.size(); ++k) {
        const Task & t = job.tasks[k];
        fuzz_sleep(w.fuzz);
        run_task(w, job, t, mem, sets[t.stage][static_cast<size_t>(t.mb % 2)]);
        released[k] = 1;
    }

    // Gradients: D2H into the pinned slots after the last micro-batch (the slots are free: the controller
    // waited grad_copied before dispatching).
    Stream & ds = w.dev->stream(StreamKind::Download);
    std::shared_ptr<Event> tail = record(w, StreamKind::Compute);
    ds.wait(*tail);
    if (job.has_grads)
        for (int l = job.range.begin; l < job.range.end; ++l) {
            LayerSync & ls = *sync[static_cast<size_t>(l)];
            if (!ls.trainable) continue;
            const auto & ts = prog.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                if (ts[i].param < 0) continue;
                ds.copy(staging[static_cast<size_t>(l)][i].data(), mem[static_cast<size_t>(l - job.range.begin)].grad[i], ts[i].bytes,
                        CopyKind::DeviceToHost, OpLabel("G down " + job.label, cat0));
                std::lock_guard<std::mutex> lk(inst_m);
                ++downloads[static_cast<size_t>(l)][i];
            }
            ls.set_grad_downloaded(record(w, StreamKind::Download));
            ls.grad_download_started.set();
        }
    w.retired.push_back({record(w, StreamKind::Download), std::move(owned), job.call});
}

void Pipeline::Impl::run_task(Worker & w, Job & job, const Task & t, std::vector<LayerMemory> & mem, ActSet & s) {
    Call & c = *job.call;
    const StageDesc & sd = c.stages[static_cast<size_t>(t.stage)];
    const int a = sd.layers.begin, b = sd.layers.end, i = t.mb;
    const size_t mi = static_cast<size_t>(i);
    const MicroBatchInfo info = c.info[mi];
    const size_t H = prog.hidden_bytes(info), I = prog.token_bytes(info);
    const std::string tag = sd.name + std::string(" mb").append(std::to_string(i));
    Stream & as = w.dev->stream(StreamKind::ActivationUpload);
    Stream & cs = w.dev->stream(StreamKind::Compute);
    Stream & ds = w.dev->stream(StreamKind::Download);
    auto lm = [&](int l) -> LayerMemory & { return mem[static_cast<size_t>(l - job.range.begin)]; };
    ProgramContext pc;
    pc.device = w.dev;
    pc.n_threads = opt.threads_per_device;

    if (t.stage > 0) c.sem[static_cast<size_t>(t.stage - 1)]->acquire();  // the predecessor enqueued micro-batch i
    if (s.free) as.wait(*s.free);
    // Uploads: the input of layer l (token ids for l == 0), gated by its producer's event.
    auto upload_input = [&](int l, void * dst) {
        if (l == 0) {
            as.copy(dst, c.ids[mi].data(), I, CopyKind::HostToDevice, OpLabel("A " + tag, sd.cat));
        } else {
            // Unset only when its producer failed (the call then reports that error): nothing to wait for.
            if (const auto & ev = c.act_ready[static_cast<size_t>(l)][mi]) as.wait(*ev);
            as.copy(dst, c.act[static_cast<size_t>(l)][mi].data(), H, CopyKind::HostToDevice, OpLabel("A " + tag, sd.cat));
        }
    };
    std::shared_ptr<Event> d2h_done;
    switch (sd.pass) {
    case Pass::Fwd: {
        upload_input(a, s.in[0]);
        auto mark = record(w, StreamKind::ActivationUpload);
        w.marks.push_back(mark);
        cs.wait(*mark);
        if (s.free) cs.wait(*s.free);
        for (int l = a; l < b; ++l) {
            void * in = l == a ? s.in[0] : s.work[static_cast<size_t>(l - 1 - a)];
            void * out = s.work[static_cast<size_t>(l - a)];
            timed_launch(w, c, l, 0, OpLabel(tag, sd.cat), [this, l, mlm = lm(l), in, out, info, pc]() mutable { prog.forward(l, mlm, in, out, info, pc); });
            if (c.need_act[static_cast<size_t>(l + 1)]) {
                ds.wait(*record(w, StreamKind::Compute));
                ds.copy(c.act[static_cast<size_t>(l + 1)][mi].data(), out, H, CopyKind::DeviceToHost, OpLabel("D " + tag, sd.cat));
                c.act_ready[static_cast<size_t>(l + 1)][mi] = record(w, StreamKind::Download);
            }
        }
        ds.wait(*record(w, StreamKind::Compute));
        break;
    }
    case Pass::Fused: {
        upload_input(a, s.in[0]);
        as.copy(s.labels, c.labels[mi].data(), I, CopyKind::HostToDevice, OpLabel("A " + tag, sd.cat));
        auto mark = record(w, StreamKind::ActivationUpload);
        w.marks.push_back(mark);
        cs.wait(*mark);
        if (s.free) cs.wait(*s.free);
        auto x = [&](int l) { return l == a ? s.in[0] : s.work[static_cast<size_t>(l - a - 1)]; };
        for (int l = a; l < L - 1; ++l)
            timed_launch(w, c, l, 0, OpLabel(tag, sd.cat), [this, l, mlm = lm(l), in = x(l), out = x(l + 1), info, pc]() mutable {
                prog.forward(l, mlm, in, out, info, pc);
            });
        timed_launch(w, c, L - 1, 2, OpLabel(tag, sd.cat), [this, mlm = lm(L - 1), in = x(L - 1), lab = s.labels, loss = s.loss, d0 = s.d[0], info, pc]() mutable {
            prog.head(mlm, in, static_cast<const int32_t *>(lab), loss, d0, info, pc);
        });
        int cur = 0;
        for (int l = L - 2; l >= a; --l) {
            void * din = l == 0 ? nullptr : s.d[1 - cur];
            timed_launch(w, c, l, 1, OpLabel(tag, sd.cat), [this, l, mlm = lm(l), in = x(l), dout = s.d[cur], din, info, pc]() mutable {
                prog.backward(l, mlm, in, dout, din, info, pc);
            });
            if (l != 0) cur = 1 - cur;
        }
        ds.wait(*record(w, StreamKind::Compute));
        ds.copy(static_cast<float *>(c.loss.data()) + i, s.loss, sizeof(float), CopyKind::DeviceToHost, OpLabel("D loss " + tag, sd.cat));
        c.loss_ready[mi] = record(w, StreamKind::Download);
        if (a > 0) {
            ds.copy(c.dact[static_cast<size_t>(a)][mi].data(), s.d[cur], H, CopyKind::DeviceToHost, OpLabel("D " + tag, sd.cat));
            c.dact_ready[static_cast<size_t>(a)][mi] = record(w, StreamKind::Download);
        }
        break;
    }
    case Pass::Bwd: {
        if (const auto & ev = c.dact_ready[static_cast<size_t>(b)][mi]) as.wait(*ev);
        as.copy(s.dout, c.dact[static_cast<size_t>(b)][mi].data(), H, CopyKind::HostToDevice, OpLabel("A " + tag, sd.cat));
        const bool layer_grain = c.plan.grain == RecomputeGrain::Layer;
        if (layer_grain)
            for (int l = a; l < b; ++l) upload_input(l, s.in[static_cast<size_t>(l - a)]);
        else
            upload_input(a, s.in[0]);
        auto mark = record(w, StreamKind::ActivationUpload);
        w.marks.push_back(mark);
        cs.wait(*mark);
        if (s.free) cs.wait(*s.free);
        auto x = [&](int l) { return layer_grain ? s.in[static_cast<size_t>(l - a)] : (l == a ? s.in[0] : s.work[static_cast<size_t>(l - a - 1)]); };
        if (!layer_grain)  // recompute the stage's layer inputs from the checkpoint
            for (int l = a; l < b - 1; ++l)
                timed_launch(w, c, l, 0, OpLabel(tag, sd.cat), [this, l, mlm = lm(l), in = x(l), out = x(l + 1), info, pc]() mutable {
                    prog.forward(l, mlm, in, out, info, pc);
                });
        void * dout = s.dout;
        int cur = 0;
        for (int l = b - 1; l >= a; --l) {
            void * din = l == 0 ? nullptr : s.d[cur];
            timed_launch(w, c, l, 1, OpLabel(tag, sd.cat), [this, l, mlm = lm(l), in = x(l), dout, din, info, pc]() mutable {
                prog.backward(l, mlm, in, dout, din, info, pc);
            });
            if (l != 0) {
                dout = din;
                cur = 1 - cur;
            }
        }
        ds.wait(*record(w, StreamKind::Compute));
        if (a > 0) {
            ds.copy(c.dact[static_cast<size_t>(a)][mi].data(), dout, H, CopyKind::DeviceToHost, OpLabel("D " + tag, sd.cat));
            c.dact_ready[static_cast<size_t>(a)][mi] = record(w, StreamKind::Download);
        }
        break;
    }
    }
    s.free = record(w, StreamKind::Download);
    c.sem[static_cast<size_t>(t.stage)]->release();
    if (t.stage == c.fb) c.fused_done.release();
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer thread

void Pipeline::Impl::opt_loop() {
    for (;;) {
        std::function<void()> fn;
        {
            std::unique_lock<std::mutex> lk(opt_m);
            opt_cv.wait(lk, [&] { return opt_stop || !opt_queue.empty(); });
            if (opt_queue.empty()) return;
            fn = std::move(opt_queue.front());
            opt_queue.pop_front();
            opt_busy = true;
        }
        fuzz_sleep(opt_fuzz);
        try {
            fn();
        } catch (const std::exception & e) {
            record_error(std::string("optimizer: ") + e.what());
        }
        {
            std::lock_guard<std::mutex> lk(opt_m);
            opt_busy = false;
        }
        opt_cv.notify_all();
    }
}

void Pipeline::Impl::enqueue_opt(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lk(opt_m);
        opt_queue.push_back(std::move(fn));
    }
    opt_cv.notify_all();
}

void Pipeline::Impl::copy_back() {
    // Every weight upload enqueued so far has completed (no torn weights, §9.1 edge 1) — all layers, since a
    // shared tensor may have been uploaded by another layer.
    for (auto & ls : sync) {
        ls->param_upload_started.wait();
        for (const auto & ev : ls->take_uploads()) ev->synchronize();
    }
    const auto & params = prog.params();
    std::vector<char> copied(params.size(), 0);
    for (int l = 0; l < L; ++l) {
        for (const auto & ti : prog.layer_tensors(l)) {
            if (ti.param < 0 || copied[static_cast<size_t>(ti.param)]) continue;
            const auto & pi = params[static_cast<size_t>(ti.param)];
            std::memcpy(working[static_cast<size_t>(ti.param)].data(), pi.master, pi.n * sizeof(float));
            copied[static_cast<size_t>(ti.param)] = 1;
        }
        sync[static_cast<size_t>(l)]->param_copied.set();
        fuzz_sleep(opt_fuzz);
    }
}

void Pipeline::Impl::hand_off(int64_t n_calls) {
    const auto & params = prog.params();
    std::vector<char> touched(params.size(), 0);
    for (int l = L - 1; l >= 0; --l) {  // deep layers finish first
        LayerSync & ls = *sync[static_cast<size_t>(l)];
        if (ls.trainable) {
            ls.grad_download_started.wait();
            if (auto ev = ls.last_grad_download()) ev->synchronize();
            const auto & ts = prog.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                if (ts[i].param < 0) continue;
                const auto & pi = params[static_cast<size_t>(ts[i].param)];
                const float * src = staging[static_cast<size_t>(l)][i].as<float>();
                if (!touched[static_cast<size_t>(ts[i].param)]) {
                    std::memcpy(pi.grad, src, pi.n * sizeof(float));
                    touched[static_cast<size_t>(ts[i].param)] = 1;
                } else {
                    for (size_t e = 0; e < pi.n; ++e) pi.grad[e] = pi.grad[e] + src[e];
                }
                std::lock_guard<std::mutex> lk(inst_m);
                int64_t & n = downloads[static_cast<size_t>(l)][i];
                if (n != n_calls) ++checks.grad_slot_errors;
                n = 0;
                ++checks.grads_handed_off;
            }
        }
        ls.grad_copied.set();
        fuzz_sleep(opt_fuzz);
    }
    for (size_t p = 0; p < params.size(); ++p)
        if (!touched[p]) {
            std::lock_guard<std::mutex> lk(inst_m);
            ++checks.grad_slot_errors;  // a parameter no layer owns
        }
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

double Pipeline::forward_backward(const std::vector<MicroBatch> & mbs) {
    Impl & d = *impl_;
    d.throw_if_failed();
    if (mbs.empty()) throw Error("forward_backward: no micro-batches");
    d.harvest_timings();
    std::shared_ptr<Call> c = d.make_call(mbs);
    d.unharvested.push_back(c);
    while (d.unharvested.size() > 4) d.unharvested.pop_front();  // never hold more than a few calls' buffers
    d.last_plan = c->plan;
    const auto jobs = d.make_jobs(c);
    for (size_t j = 0; j < jobs.size(); ++j) {
        const int dev = d.opt.schedule == ScheduleKind::RoundPipe ? static_cast<int>(d.rr++ % static_cast<uint64_t>(d.G))
                                                                  : static_cast<int>(j);
        d.dispatch(jobs[j], dev);
    }
    ++d.calls_in_step;
    for (int i = 0; i < c->M; ++i) c->fused_done.acquire();
    double loss = 0;
    for (int i = 0; i < c->M; ++i) {
        if (auto & ev = c->loss_ready[static_cast<size_t>(i)]) ev->synchronize();
        loss += c->loss.as<float>()[i];
    }
    d.throw_if_failed();
    return loss;
}

void Pipeline::step(std::function<void()> update) {
    Impl & d = *impl_;
    d.throw_if_failed();
    d.optim_updated.wait_and_clear();  // one update in flight at most
    for (auto & ls : d.sync) {
        ls->param_copied.wait_and_clear();
        ls->grad_copied.wait_and_clear();
        ls->host_grad_pending = false;
    }
    const int64_t n = std::exchange(d.calls_in_step, 0);
    auto upd = [&d, update = std::move(update)] {
        if (update) update();
    };
    if (d.opt.async) {
        d.enqueue_opt([&d] { d.copy_back(); });
        d.enqueue_opt([&d, n] { d.hand_off(n); });
        d.enqueue_opt(upd);
        d.enqueue_opt([&d] { d.optim_updated.set(); });
    } else {
        d.enqueue_opt([&d, n] { d.hand_off(n); });
        d.enqueue_opt(upd);
        d.enqueue_opt([&d] { d.copy_back(); });
        d.enqueue_opt([&d] { d.optim_updated.set(); });
        d.optim_updated.wait();
        d.throw_if_failed();
    }
}

void Pipeline::synchronize() {
    Impl & d = *impl_;
    {
        std::unique_lock<std::mutex> lk(d.opt_m);
        d.opt_cv.wait(lk, [&] { return d.opt_queue.empty() && !d.opt_busy; });
    }
    for (auto & w : d.workers) {
        {
            std::unique_lock<std::mutex> lk(w->m);
            w->cv.wait(lk, [&] { return w->queue.empty() && !w->busy; });
        }
        try {
            w->dev->synchronize();
        } catch (const std::exception & e) {
            d.record_error(w->dev->name() + ": " + e.what());
        }
    }
    const auto & params = d.prog.params();
    for (size_t p = 0; p < params.size(); ++p) std::memcpy(d.working[p].data(), params[p].master, params[p].n * sizeof(float));
    d.throw_if_failed();
}

const Plan & Pipeline::last_plan() const { return impl_->last_plan; }

int Pipeline::num_devices() const { return impl_->G; }

int Pipeline::timing_samples() const { return impl_->timings->samples(); }

PipelineChecks Pipeline::checks() const {
    Impl & d = *impl_;
    std::lock_guard<std::mutex> lk(d.inst_m);
    PipelineChecks c = d.checks;
    c.flag_violations = HostFlag::violations() - d.flag_violations_at_start;
    c.weight_version_mismatches = 0;
    for (const auto & [key, hashes] : d.weight_hashes)
        for (uint64_t h : hashes) c.weight_version_mismatches += h != hashes.front() ? 1 : 0;
    return c;
}

} // namespace rp
