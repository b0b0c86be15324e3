#include "ggml_rp/roundpipe/speed_plans.h"

#include "ggml_rp/roundpipe/memory_plan.h"
#include "ggml_rp/roundpipe/planner.h"

#include <algorithm>
#include <set>

namespace rp {

namespace {

// A stage's time per micro-batch of the mean size, at speed 1 (job_task_times).
double stage_time(Pass pass, LayerRange layers, RecomputeGrain grain, const CallModelInputs & in, bool forward_only) {
    const std::vector<double> & per_layer = pass == Pass::Fwd || forward_only ? *in.tf : *in.tb;
    double sum = 0;
    for (int l = layers.begin; l < layers.end; ++l) sum += per_layer[static_cast<size_t>(l)];
    if (pass == Pass::Bwd && !forward_only && grain == RecomputeGrain::Stage)
        for (int l = layers.begin; l + 1 < layers.end; ++l) sum += (*in.tf)[static_cast<size_t>(l)];
    return sum;
}

// Each micro-batch's tokens over the call's mean.
std::vector<double> token_scales(const std::vector<MicroBatchInfo> & info) {
    double mean = 0;
    for (const MicroBatchInfo & m : info) mean += static_cast<double>(m.tokens());
    mean /= static_cast<double>(std::max<size_t>(info.size(), 1));
    std::vector<double> s;
    s.reserve(info.size());
    for (const MicroBatchInfo & m : info) s.push_back(mean > 0 ? static_cast<double>(m.tokens()) / mean : 1.0);
    return s;
}

} // namespace

std::vector<double> job_task_times(const std::vector<StageDesc> & stages, RecomputeGrain grain, const CallModelInputs & in,
                                   bool forward_only, const JobSpec & spec) {
    const std::vector<double> scale = token_scales(*in.info);
    std::vector<double> ms;
    ms.reserve(spec.tasks.size());
    for (const Task & t : spec.tasks) {
        const StageDesc & sd = stages[static_cast<size_t>(t.stage)];
        ms.push_back(stage_time(sd.pass, sd.layers, grain, in, forward_only) * scale[static_cast<size_t>(t.mb)]);
    }
    return ms;
}

int model_job(Dispatcher & d, const std::vector<StageDesc> & stages, RecomputeGrain grain, const CallModelInputs & in,
              bool forward_only, const JobSpec & spec, int bound, const std::vector<char> * allowed) {
    const bool fused = stages[static_cast<size_t>(spec.tasks.front().stage)].pass == Pass::Fused;
    const std::vector<double> ms = job_task_times(stages, grain, in, forward_only, spec);
    if (bound < 0) return d.pick(ms, fused, allowed);
    d.assign(bound, ms, fused);
    return bound;
}

// The RoundPipe jobs (schedules.h) without building them: one per stage in plan order, each over the
// micro-batches in order.
double predicted_call_end(const Dispatcher & d, bool devices_idle, const Plan & plan, const CallModelInputs & in,
                          const std::vector<int> * bound) {
    Dispatcher trial = d;
    trial.begin_call(devices_idle);
    const std::vector<double> scale = token_scales(*in.info);
    std::vector<double> ms(scale.size());
    size_t k = 0;
    auto job = [&](Pass pass, LayerRange layers) {
        const double t = stage_time(pass, layers, plan.grain, in, false);
        for (size_t m = 0; m < ms.size(); ++m) ms[m] = t * scale[m];
        const bool fused = pass == Pass::Fused;
        if (bound) trial.assign((*bound)[k], ms, fused);
        else trial.pick(ms, fused);
        ++k;
    };
    for (const LayerRange & r : plan.fwd) job(Pass::Fwd, r);
    for (size_t i = 0; i < plan.bwd.size(); ++i) job(i == 0 ? Pass::Fused : Pass::Bwd, plan.bwd[i]);
    return trial.predicted_end();
}

std::vector<SpeedPlan> speed_plans(const Dispatcher & d, bool devices_idle, const Plan & planned, const CallModelInputs & in) {
    const int G = static_cast<int>(d.speeds().size());
    const int e = planned.fb_begin();
    const int f = static_cast<int>(planned.fwd.size()), b = static_cast<int>(planned.bwd.size()) - 1;
    auto devices_of = [&](const Plan & p, int rotation) {
        std::vector<int> dev(static_cast<size_t>(p.num_stages()));
        for (size_t k = 0; k < dev.size(); ++k) dev[k] = static_cast<int>((static_cast<size_t>(d.pointer() + rotation) + k) % static_cast<size_t>(G));
        return dev;
    };
    auto even = [](int layers, int n) {
        std::vector<int> sizes;
        for (int k = 0; k < n; ++k) sizes.push_back(layers * (k + 1) / n - layers * k / n);
        return sizes;
    };
    std::vector<SpeedPlan> plans;
    std::set<std::pair<int, int>> tried;  // (forward, backward) counts, per grain
    RecomputeGrain grain = planned.grain;
    auto try_counts = [&](int f2, int b2) {
        if (!tried.insert({f2, b2}).second) return;
        std::vector<int> bwd_sizes{planned.bwd.front().size()};
        for (int x : even(e, b2)) bwd_sizes.push_back(x);
        const Plan skeleton = plan_from_sizes(even(e, f2), bwd_sizes, grain);
        for (int rotation = 0; rotation < G; ++rotation) {
            std::vector<double> speed;
            for (int dev : devices_of(skeleton, rotation)) speed.push_back(d.speeds()[static_cast<size_t>(dev)]);
            SpeedPlan s;
            s.plan = split_by_speed(skeleton, *in.tf, *in.tb, speed);
            s.devices = devices_of(s.plan, rotation);
            s.rotation = rotation;
            s.counts = {f2, b2};
            s.end = predicted_call_end(d, devices_idle, s.plan, in, &s.devices);
            plans.push_back(std::move(s));
        }
    };
    auto best_counts = [&](size_t from) {
        return std::min_element(plans.begin() + static_cast<long>(from), plans.end(),
                                [](const SpeedPlan & x, const SpeedPlan & y) { return x.end < y.end; })
            ->counts;
    };
    const std::pair<int, int> ratios[] = {{1, 1}, {3, 2}, {2, 1}, {1, 2}, {1, 3}, {1, 4}};
    auto scaled = [&](int n, std::pair<int, int> r) { return n == 0 ? 0 : std::clamp((n * r.first + r.second / 2) / r.second, 1, std::max(e, 1)); };
    // Layer grain as well where the planner's plan keeps most layers' inputs in host memory already (at least
    // kLayerGrainKept of what layer grain keeps: every layer's input): a fast device's backward stage of several
    // layers then recomputes nothing, where at stage grain the forwards recomputing the inputs of its upper layers
    // add about a quarter to it, for at most a third more host activations than the planner's plan.
    std::vector<RecomputeGrain> grains{planned.grain};
    if (planned.grain == RecomputeGrain::Stage) {
        Plan layer_grain = planned;
        layer_grain.grain = RecomputeGrain::Layer;
        auto kept = [&](const Plan & p) {
            const BoundaryBuffers bb = boundary_buffers(p, p.num_layers());
            return static_cast<double>(std::count(bb.act.begin(), bb.act.end(), 1));
        };
        if (kept(planned) >= kLayerGrainKept * kept(layer_grain)) grains.push_back(RecomputeGrain::Layer);
    }
    for (RecomputeGrain g : grains) {
        grain = g;
        tried.clear();
        const size_t from = plans.size();
        for (const auto & fr : ratios)
            for (const auto & br : ratios) try_counts(scaled(f, fr), scaled(b, br));
        for (int round = 0; round < kCountRounds; ++round) {
            const std::pair<int, int> start = best_counts(from);
            if (f > 0)
                for (int f2 = 1; f2 <= e; ++f2) try_counts(f2, start.second);
            const int f_best = best_counts(from).first;
            if (b > 0)
                for (int b2 = 1; b2 <= e; ++b2) try_counts(f_best, b2);
            if (best_counts(from) == start) break;
        }
    }
    std::stable_sort(plans.begin(), plans.end(), [](const SpeedPlan & x, const SpeedPlan & y) { return x.end < y.end; });
    return plans;
}

} // namespace rp
