#include "ggml_rp/roundpipe/schedules.h"

#include "base/error.h"

#include <algorithm>

namespace rp {

ScheduleKind schedule_from_name(std::string_view name) {
    if (name == "roundpipe") return ScheduleKind::RoundPipe;
    if (name == "gpipe") return ScheduleKind::GPipe;
    if (name == "1f1b") return ScheduleKind::OneFOneB;
    throw Error("pipeline schedule: unknown schedule '" + std::string(name) + "' (roundpipe, gpipe or 1f1b)");
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

std::vector<StageDesc> plan_stages(const Plan & p) {
    std::vector<StageDesc> stages;
    for (size_t i = 0; i < p.fwd.size(); ++i) {
        // (Appended, not "F" + ...: GCC 12 warns falsely (-Wrestrict) on a literal + std::string&&.)
        const std::string n = std::string("F").append(std::to_string(i));
        stages.push_back({Pass::Fwd, p.fwd[i], n, std::string("fwd/").append(n)});
    }
    stages.push_back({Pass::Fused, p.bwd[0], "FB", "fused/FB"});
    for (size_t i = 1; i < p.bwd.size(); ++i) {
        const std::string n = std::string("B").append(std::to_string(i));
        stages.push_back({Pass::Bwd, p.bwd[i], n, std::string("bwd/").append(n)});
    }
    return stages;
}

std::vector<JobSpec> schedule_jobs(ScheduleKind kind, const Plan & plan, const std::vector<StageDesc> & stages, int M) {
    std::vector<JobSpec> jobs;
    if (kind == ScheduleKind::RoundPipe) {
        for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
            const StageDesc & sd = stages[static_cast<size_t>(s)];
            JobSpec j;
            j.layers = sd.layers;
            j.label = sd.name;
            j.has_grads = sd.pass != Pass::Fwd;
            for (int i = 0; i < M; ++i) j.tasks.push_back({s, i});
            jobs.push_back(std::move(j));
        }
        return jobs;
    }
    // Bound schedules: device d holds range d for the whole call.
    const int fb = fused_stage(plan);
    const int Gb = static_cast<int>(plan.fwd.size()) + 1;
    for (int d = 0; d < Gb; ++d) {
        const bool last = d == Gb - 1;
        const int fs = d, bs = last ? fb : fb + (Gb - 1 - d);
        JobSpec j;
        j.layers = stages[static_cast<size_t>(last ? fb : fs)].layers;
        j.label = std::string("dev").append(std::to_string(d));
        j.device = d;
        j.has_grads = true;
        if (last) {
            for (int i = 0; i < M; ++i) j.tasks.push_back({fb, i});
        } else if (kind == ScheduleKind::GPipe) {
            for (int i = 0; i < M; ++i) j.tasks.push_back({fs, i});
            for (int i = 0; i < M; ++i) j.tasks.push_back({bs, i});
        } else {  // 1F1B: warm-up forwards, then one forward + one backward, then the remaining backwards
            const int warm = std::min(Gb - 1 - d, M);
            int f = 0, b = 0;
            for (; f < warm; ++f) j.tasks.push_back({fs, f});
            while (b < M) {
                if (f < M) j.tasks.push_back({fs, f++});
                j.tasks.push_back({bs, b++});
            }
        }
        jobs.push_back(std::move(j));
    }
    return jobs;
}

std::vector<JobSpec> forward_only_jobs(std::vector<JobSpec> jobs, const std::vector<StageDesc> & stages) {
    std::vector<JobSpec> out;
    for (JobSpec & j : jobs) {
        std::erase_if(j.tasks, [&](const Task & t) { return stages[static_cast<size_t>(t.stage)].pass == Pass::Bwd; });
        if (j.tasks.empty()) continue;
        j.has_grads = false;
        out.push_back(std::move(j));
    }
    return out;
}

} // namespace rp
