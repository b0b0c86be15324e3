#include "ggml_rp/roundpipe/schedule_sim.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/speed_plans.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace rp {

int steady_window(int jobs_per_iteration, int devices);

namespace {

constexpr int kW = static_cast<int>(StreamKind::WeightUpload);
constexpr int kA = static_cast<int>(StreamKind::ActivationUpload);
constexpr int kC = static_cast<int>(StreamKind::Compute);
constexpr int kD = static_cast<int>(StreamKind::Download);
constexpr double kNever = -std::numeric_limits<double>::infinity();

enum class Pass { Fwd, Fused, Bwd };

// What one iteration produced, for the jobs after it.
struct IterState {
    std::vector<std::vector<double>> fwd_out, fwd_enq;  // [forward stage][mb]: output on host, host enqueue
    std::vector<std::vector<double>> bwd_out, bwd_enq;  // [backward stage (0 = FB)][mb]: input-grad on host
    std::vector<std::vector<double>> ckpt;              // [layer][mb]: checkpoint (layer input) on host
    std::vector<double> grad_done;                      // [layer]: grad download complete
    double upload_done = 0;                             // every weight upload of the iteration complete
    double losses_ready = 0;
    double last_compute = 0;
};

class Simulator {
public:
    Simulator(const Plan & plan, const SimModel & model, const SimConfig & cfg)
        : base_(plan), m_(model), cfg_(cfg), G_(cfg.devices), M_(cfg.micro_batches),
          L_(static_cast<int>(model.tf_ms.size())),
          dispatcher_(cfg.devices, cfg.dispatch == SimDispatch::Ready ? DispatchKind::Ready : DispatchKind::RoundRobin, cfg.device_speed) {
        free_.assign(static_cast<size_t>(G_), {0, 0, 0, 0});
        compute_ends_.resize(static_cast<size_t>(G_));
        job_ends_.resize(static_cast<size_t>(G_));
        enq_done_.assign(static_cast<size_t>(G_), 0);
        res_.jobs_per_device.assign(static_cast<size_t>(G_), 0);
        act_ms_ = cfg.act_bytes > 0 ? cfg.link.seconds(static_cast<size_t>(cfg.act_bytes)) * 1e3 : cfg.hop_ms / 2;

        use_plan(plan);
        double total_w = 0;
        for (int l = 0; l < L_; ++l) total_w += weight(l);
        copy_ms_.assign(static_cast<size_t>(L_), 0);
        for (int l = 0; l < L_; ++l) {
            copy_ms_[static_cast<size_t>(l)] =
                total_w > 0 ? cfg.copy_back_ms * weight(l) / total_w : cfg.copy_back_ms / L_;
        }
    }

    // The plan of the next iteration, and its checkpoint layers: the inputs of the backward stages' first layers
    // (stage grain) or of every layer.
    void use_plan(const Plan & plan) {
        plan_ = plan;
        needs_ckpt_.assign(static_cast<size_t>(L_), false);
        const int e = plan.fb_begin();
        if (plan.grain == RecomputeGrain::Layer) {
            for (int l = 1; l < e; ++l) needs_ckpt_[static_cast<size_t>(l)] = true;
        } else {
            for (size_t b = 1; b < plan.bwd.size(); ++b) {
                if (plan.bwd[b].begin > 0) needs_ckpt_[static_cast<size_t>(plan.bwd[b].begin)] = true;
            }
        }
    }

    // SimConfig::size_by_speed: the plan sized by speed the runtime would run this iteration's call with (its
    // model finishes it sooner than the planner's plan by readiness), bound to its devices; else the planner's.
    void plan_iteration() {
        bound_.clear();
        const bool idle = !cfg_.async_optimizer;
        if (cfg_.size_by_speed && cfg_.dispatch == SimDispatch::Ready && !dispatcher_.uniform()) {
            const std::vector<MicroBatchInfo> info(static_cast<size_t>(M_), MicroBatchInfo{});
            const CallModelInputs in{&info, &m_.tf_ms, &m_.tb_ms};
            std::vector<SpeedPlan> sized = speed_plans(dispatcher_, idle, base_, in);
            if (!sized.empty() && sized.front().end < predicted_call_end(dispatcher_, idle, base_, in)) {
                use_plan(sized.front().plan);
                bound_ = std::move(sized.front().devices);
                ++res_.sized_iterations;
                return;
            }
        }
        use_plan(base_);
    }

    SimResult run() {
        std::vector<double> param_copied(static_cast<size_t>(L_), 0), grad_copied(static_cast<size_t>(L_), 0);
        double prev_update = 0, opt_free = 0;
        for (int k = 0; k < cfg_.iterations; ++k) {
            plan_iteration();
            IterState st;
            const size_t f = plan_.fwd.size(), b = plan_.bwd.size();
            st.fwd_out.assign(f, std::vector<double>(static_cast<size_t>(M_), 0));
            st.fwd_enq = st.fwd_out;
            st.bwd_out.assign(b, std::vector<double>(static_cast<size_t>(M_), 0));
            st.bwd_enq = st.bwd_out;
            st.ckpt.assign(static_cast<size_t>(L_), std::vector<double>(static_cast<size_t>(M_), 0));
            st.grad_done.assign(static_cast<size_t>(L_), 0);

            dispatcher_.begin_call(!cfg_.async_optimizer);  // a sync step ends when every device is done
            for (size_t s = 0; s < f; ++s) run_job(Pass::Fwd, static_cast<int>(s), k, st, param_copied, grad_copied);
            for (size_t s = 0; s < b; ++s) {
                run_job(s == 0 ? Pass::Fused : Pass::Bwd, static_cast<int>(s), k, st, param_copied, grad_copied);
            }
            res_.iteration_end_ms.push_back(st.last_compute);

            const double returned = std::max(ctl_, st.losses_ready);  // forward_backward returns
            if (cfg_.async_optimizer) {
                ctl_ = std::max(returned, prev_update);  // step(): at most one update in flight
                double t = std::max({opt_free, ctl_, st.upload_done});  // copy-back waits for every upload
                for (int l = 0; l < L_; ++l) {
                    t += copy_ms_[static_cast<size_t>(l)];
                    param_copied[static_cast<size_t>(l)] = t;
                }
                for (int l = L_ - 1; l >= 0; --l) {  // grad hand-off, deep layers first
                    t = std::max(t, st.grad_done[static_cast<size_t>(l)]);
                    grad_copied[static_cast<size_t>(l)] = t;
                }
                t = std::max(t, all_reduce(grad_copied, k));
                prev_update = opt_free = t + cfg_.optimizer_ms;
            } else {
                double t = std::max(returned, st.upload_done);
                for (double g : st.grad_done) t = std::max(t, g);
                t = std::max(t, all_reduce(st.grad_done, k));
                t += cfg_.optimizer_ms + cfg_.copy_back_ms;
                ctl_ = t;
                std::fill(param_copied.begin(), param_copied.end(), t);
                std::fill(grad_copied.begin(), grad_copied.end(), t);
            }
        }

        res_.makespan_ms = last_compute_ - first_compute_;
        res_.work_per_iteration_ms = work_ / cfg_.iterations;
        res_.bubble_ratio = res_.makespan_ms > 0 ? 1 - busy_ / (G_ * res_.makespan_ms) : 0;
        const double speeds = cfg_.device_speed.empty() ? G_ : std::accumulate(cfg_.device_speed.begin(), cfg_.device_speed.end(), 0.0);
        res_.ideal_iteration_ms = res_.work_per_iteration_ms / speeds;
        const auto & ends = res_.iteration_end_ms;
        const int n = cfg_.iterations;
        // The stage -> device mapping repeats every K iterations (the pointer advances J jobs per iteration),
        // and the timing may repeat only after a few such cycles; so the steady period is the mean over the
        // second half of the run, rounded down to whole cycles.
        const int K = steady_window(base_.num_stages(), G_);
        if (n >= K + 2) {
            const int w = K * std::max(1, ((n - 2) / 2) / K);
            res_.steady_iteration_ms = (ends[static_cast<size_t>(n - 1)] - ends[static_cast<size_t>(n - 1 - w)]) / w;
        }
        else if (n >= 3) res_.steady_iteration_ms = (ends[static_cast<size_t>(n - 1)] - ends[1]) / (n - 2);
        else if (n == 2) res_.steady_iteration_ms = ends[1] - ends[0];
        else res_.steady_iteration_ms = res_.makespan_ms;
        res_.steady_bubble_ratio =
            res_.steady_iteration_ms > 0 ? 1 - busy_ / cfg_.iterations / (G_ * res_.steady_iteration_ms) : 0;
        for (int d = 0; d < G_; ++d) res_.trace.process_names[d] = "gpu " + std::to_string(d);
        if (cfg_.nodes > 1) res_.trace.process_names[G_] = "all-reduce";
        res_.trace.name_defaults();
        std::stable_sort(res_.trace.events.begin(), res_.trace.events.end(),
                         [](const TraceEvent & a, const TraceEvent & c) { return a.ts_us < c.ts_us; });
        res_.exposed_comm_fraction = analyse_trace(res_.trace).exposed_comm_fraction;
        return std::move(res_);
    }

private:
    double weight(int l) const { return m_.weight_bytes.empty() ? 0 : m_.weight_bytes[static_cast<size_t>(l)]; }
    double grad(int l) const { return m_.grad_bytes.empty() ? 0 : m_.grad_bytes[static_cast<size_t>(l)]; }

    double op(int d, int stream, double start, double dur, const std::string & name, const std::string & cat) {
        const double end = start + dur;
        if (dur > 0) {
            TraceEvent e;
            e.pid = d;
            e.tid = stream;
            e.name = name;
            e.cat = cat;
            e.ts_us = start * 1e3;
            e.dur_us = dur * 1e3;
            res_.trace.events.push_back(std::move(e));
        }
        return end;
    }

    void run_job(Pass pass, int s, int iter, IterState & st, const std::vector<double> & param_copied,
                 const std::vector<double> & grad_copied) {
        const LayerRange r = pass == Pass::Fwd ? plan_.fwd[static_cast<size_t>(s)] : plan_.bwd[static_cast<size_t>(s)];
        const std::string stage = pass == Pass::Fwd ? "F" + std::to_string(s) : pass == Pass::Fused ? "FB" : "B" + std::to_string(s);
        const std::string cat = (pass == Pass::Fwd ? "fwd/" : pass == Pass::Fused ? "fused/" : "bwd/") + stage;
        const std::string tag = " it" + std::to_string(iter);
        double job_ms = 0;  // per micro-batch at speed 1: the dispatcher's estimate
        for (int l = r.begin; l < r.end; ++l) job_ms += pass == Pass::Fwd ? m_.tf_ms[static_cast<size_t>(l)] : m_.tb_ms[static_cast<size_t>(l)];
        const std::vector<double> task_ms(static_cast<size_t>(M_), job_ms);
        int d;
        if (!bound_.empty()) {  // stages sized by speed: each on the device it was sized for
            d = bound_[static_cast<size_t>(pass == Pass::Fwd ? s : static_cast<int>(plan_.fwd.size()) + s)];
            dispatcher_.assign(d, task_ms, pass == Pass::Fused);
        } else {
            d = dispatcher_.pick(task_ms, pass == Pass::Fused);
        }
        const size_t ud = static_cast<size_t>(d);
        ++res_.jobs_per_device[ud];
        const double speed = cfg_.device_speed.empty() ? 1.0 : cfg_.device_speed[ud];

        // controller: host flags of the job's layers, then the device's idle semaphore
        double dispatch = std::max(ctl_, enq_done_[ud]);
        for (int l = r.begin; l < r.end; ++l) {
            dispatch = std::max(dispatch, param_copied[static_cast<size_t>(l)]);
            if (pass != Pass::Fwd) dispatch = std::max(dispatch, grad_copied[static_cast<size_t>(l)]);
        }
        ctl_ = dispatch;

        // per micro-batch compute: forward stages Σtf; FB Σtb (forward, loss, backward; the loss is ready after
        // the forward part Σtf); backward stages Σtf of recompute, then Σ(tb - tf) of backward
        double wbytes = 0, gbytes = 0, t_fwd = 0, t_all = 0;
        for (int l = r.begin; l < r.end; ++l) {
            wbytes += weight(l);
            gbytes += grad(l);
            t_fwd += m_.tf_ms[static_cast<size_t>(l)];
            t_all += pass == Pass::Fwd ? m_.tf_ms[static_cast<size_t>(l)] : m_.tb_ms[static_cast<size_t>(l)];
        }
        const double work = t_all;  // (at speed 1)
        t_fwd /= speed;
        t_all /= speed;
        const double t_bwd_part = std::max(0.0, t_all - t_fwd);

        // weights: prefetch depth 1 -- wait for the compute of the job before the previous one here
        double w_end = kNever;
        const auto & jobs_here = job_ends_[ud];
        if (wbytes > 0) {
            const double prefetch_gate = jobs_here.size() >= 2 ? jobs_here[jobs_here.size() - 2] : 0;
            const double start = std::max({dispatch, free_[ud][kW], prefetch_gate});
            w_end = op(d, kW, start, cfg_.link.seconds(static_cast<size_t>(wbytes)) * 1e3, stage + " weights" + tag, cat);
            free_[ud][kW] = w_end;
            st.upload_done = std::max(st.upload_done, w_end);
        }

        double last_end = 0, enq = dispatch;
        for (int i = 0; i < M_; ++i) {
            const size_t ui = static_cast<size_t>(i);
            const std::string mb = " mb" + std::to_string(i) + tag;
            // host: the device thread enqueues micro-batch i after the producer stage enqueued it (§9.2)
            double producer_enq = dispatch;
            std::vector<std::pair<double, std::string>> inputs;  // needed before the first compute op
            std::pair<double, std::string> grad_in{kNever, ""};  // backward stages: needed before backward
            if (pass == Pass::Fwd) {
                if (s > 0) {
                    producer_enq = st.fwd_enq[static_cast<size_t>(s - 1)][ui];
                    inputs.emplace_back(st.fwd_out[static_cast<size_t>(s - 1)][ui], " in");
                }
            } else if (pass == Pass::Fused) {
                if (!plan_.fwd.empty()) {
                    producer_enq = st.fwd_enq.back()[ui];
                    inputs.emplace_back(st.fwd_out.back()[ui], " in");
                }
            } else {
                producer_enq = st.bwd_enq[static_cast<size_t>(s - 1)][ui];
                for (int l = r.begin; l < r.end; ++l) {
                    if (l == 0 || !needs_ckpt_[static_cast<size_t>(l)]) continue;
                    inputs.emplace_back(st.ckpt[static_cast<size_t>(l)][ui], " ckpt L" + std::to_string(l));
                }
                grad_in = {st.bwd_out[static_cast<size_t>(s - 1)][ui], " grad in"};
            }
            enq = std::max(dispatch, producer_enq);
            if (pass == Pass::Fwd) st.fwd_enq[static_cast<size_t>(s)][ui] = enq;
            else st.bwd_enq[static_cast<size_t>(s)][ui] = enq;

            // activation uploads: may overlap the previous micro-batch's compute, not the one before
            auto & ends = compute_ends_[ud];
            const double up_gate = ends.size() >= 2 ? ends[ends.size() - 2] : 0;
            auto upload = [&](double ready, const std::string & what) {
                const double start = std::max({enq, free_[ud][kA], ready, up_gate});
                free_[ud][kA] = op(d, kA, start, act_ms_, stage + what + mb, cat);
                return free_[ud][kA];
            };
            double up_end = kNever;
            for (const auto & [ready, what] : inputs) up_end = std::max(up_end, upload(ready, what));

            double c_start = 0, c_end = 0;
            if (pass != Pass::Bwd) {
                c_start = std::max({enq, free_[ud][kC], w_end, up_end});
                c_end = op(d, kC, c_start, t_all, stage + mb, cat);
                if (pass == Pass::Fused) st.losses_ready = std::max(st.losses_ready, c_start + t_fwd);
            } else {
                c_start = std::max({enq, free_[ud][kC], w_end, up_end});
                const double re_end = op(d, kC, c_start, t_fwd, stage + " recompute" + mb, "recompute/" + stage);
                const double g_end = upload(grad_in.first, grad_in.second);
                c_end = op(d, kC, std::max(re_end, g_end), t_bwd_part, stage + mb, cat);
            }
            free_[ud][kC] = c_end;
            ends.push_back(c_end);
            last_end = c_end;
            work_ += work;
            busy_ += t_all;
            first_compute_ = std::min(first_compute_, c_start);
            last_compute_ = std::max(last_compute_, c_end);
            st.last_compute = std::max(st.last_compute, c_end);

            auto download = [&](const std::string & what) {
                const double start = std::max(free_[ud][kD], c_end);
                free_[ud][kD] = op(d, kD, start, act_ms_, stage + what + mb, cat);
                return free_[ud][kD];
            };
            if (pass == Pass::Fwd) {
                st.fwd_out[static_cast<size_t>(s)][ui] = download(" out");
                for (int l = r.begin; l < r.end; ++l) {
                    if (!needs_ckpt_[static_cast<size_t>(l)]) continue;
                    if (l == r.begin) {  // the job's own input: already on the host
                        st.ckpt[static_cast<size_t>(l)][ui] = s > 0 ? st.fwd_out[static_cast<size_t>(s - 1)][ui] : 0;
                    } else {
                        st.ckpt[static_cast<size_t>(l)][ui] = download(" ckpt L" + std::to_string(l));
                    }
                }
            } else {
                st.bwd_out[static_cast<size_t>(s)][ui] = r.begin > 0 ? download(" grad out") : c_end;
            }
        }
        job_ends_[ud].push_back(last_end);
        enq_done_[ud] = enq;

        if (pass != Pass::Fwd) {
            double gd = last_end;
            if (gbytes > 0) {
                const double start = std::max(free_[ud][kD], last_end);
                gd = op(d, kD, start, cfg_.link.seconds(static_cast<size_t>(gbytes)) * 1e3, stage + " weight grads" + tag, cat);
                free_[ud][kD] = gd;
            }
            for (int l = r.begin; l < r.end; ++l) st.grad_done[static_cast<size_t>(l)] = gd;
        }
    }

    const Plan base_;        // the planner's plan
    Plan plan_;              // this iteration's (use_plan)
    std::vector<int> bound_; // this iteration's stage devices when sized by speed, else empty (by dispatch)
    const SimModel & m_;
    const SimConfig & cfg_;
    int G_, M_, L_;
    double act_ms_ = 0;
    std::vector<bool> needs_ckpt_;
    std::vector<double> copy_ms_;
    std::vector<std::array<double, 4>> free_;
    std::vector<std::vector<double>> compute_ends_, job_ends_;
    std::vector<double> enq_done_;
    Dispatcher dispatcher_;  // the runtime's rule (dispatcher.h): the round-robin pointer or by readiness
    double ctl_ = 0;
    double work_ = 0;  // compute time at speed 1
    double busy_ = 0;  // compute time at the devices' speeds
    double first_compute_ = std::numeric_limits<double>::infinity();
    double last_compute_ = 0;
    double node_link_free_ = 0;
    SimResult res_;

    // The data-parallel all-reduce of iteration k, layers handed off at ready[l]: returns when the last
    // bucket is reduced (0 without nodes).
    double all_reduce(const std::vector<double> & ready, int k) {
        if (cfg_.nodes <= 1 || m_.grad_bytes.empty()) return 0;
        const double share = static_cast<double>(cfg_.nodes - 1) / cfg_.nodes;
        double pending = 0, end = 0;
        int bucket = 0;
        int last = 0;  // the shallowest layer with gradients: the last bucket closes there
        while (last < L_ && m_.grad_bytes[static_cast<size_t>(last)] <= 0) ++last;
        for (int l = L_ - 1; l >= last; --l) {
            pending += m_.grad_bytes[static_cast<size_t>(l)];
            if (pending <= 0 || (pending < cfg_.bucket_bytes && l != last)) continue;
            const double start = std::max(node_link_free_, ready[static_cast<size_t>(l)]);
            const double dur = 2e3 * cfg_.node_link.seconds(static_cast<size_t>(share * pending));
            TraceEvent e;
            e.pid = G_;
            e.tid = kAllReduceStream;
            e.name = "all-reduce it" + std::to_string(k) + " bucket " + std::to_string(bucket++);
            e.cat = "allreduce";
            e.ts_us = start * 1e3;
            e.dur_us = dur * 1e3;
            res_.trace.events.push_back(e);
            res_.allreduce_ms_per_iteration += dur / cfg_.iterations;
            node_link_free_ = end = start + dur;
            pending = 0;
        }
        return end;
    }
};

} // namespace

int steady_window(int jobs_per_iteration, int devices) {
    return devices / std::gcd(std::max(jobs_per_iteration, 1), std::max(devices, 1));
}

SimResult simulate_roundpipe(const Plan & plan, const SimModel & model, const SimConfig & cfg) {
    const size_t L = model.tf_ms.size();
    validate_plan(plan, static_cast<int>(L));
    if (model.tb_ms.size() != L) throw Error("simulate: tf_ms and tb_ms have different lengths");
    if (!model.weight_bytes.empty() && model.weight_bytes.size() != L) throw Error("simulate: weight_bytes length");
    if (!model.grad_bytes.empty() && model.grad_bytes.size() != L) throw Error("simulate: grad_bytes length");
    for (size_t l = 0; l < L; ++l) {
        if (!(model.tf_ms[l] >= 0) || !(model.tb_ms[l] >= 0)) {
            throw Error("simulate: layer " + std::to_string(l) + " has a negative time");
        }
    }
    if (cfg.devices < 1) throw Error("simulate: devices must be at least 1");
    if (!cfg.device_speed.empty() && static_cast<int>(cfg.device_speed.size()) != cfg.devices)
        throw Error("simulate: " + std::to_string(cfg.device_speed.size()) + " device speeds for " + std::to_string(cfg.devices) + " devices");
    for (double v : cfg.device_speed)
        if (!(v > 0) || !std::isfinite(v)) throw Error("simulate: a device speed must be a finite number > 0");
    if (cfg.micro_batches < 1) throw Error("simulate: micro_batches must be at least 1");
    if (cfg.iterations < 1) throw Error("simulate: iterations must be at least 1");
    if (cfg.hop_ms < 0 || cfg.optimizer_ms < 0 || cfg.copy_back_ms < 0 || cfg.act_bytes < 0) {
        throw Error("simulate: negative time or size in the configuration");
    }
    if (cfg.nodes < 1) throw Error("simulate: nodes must be at least 1");
    if (cfg.nodes > 1 && model.grad_bytes.empty()) throw Error("simulate: nodes > 1 needs the layers' grad_bytes");
    SimResult r = Simulator(plan, model, cfg).run();
    if (cfg.nodes > 1) r.exposed_allreduce_ms_per_iteration = analyse_trace(r.trace).exposed_allreduce_us * 1e-3 / cfg.iterations;
    return r;
}

} // namespace rp
