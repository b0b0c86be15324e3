#include "ggml_rp/roundpipe/dispatcher.h"

#include "base/error.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <string>

namespace rp {

DispatchKind dispatch_from_name(std::string_view name) {
    if (name == "round-robin") return DispatchKind::RoundRobin;
    if (name == "ready") return DispatchKind::Ready;
    throw Error("dispatch '" + std::string(name) + "': expected round-robin or ready");
}

const char * dispatch_name(DispatchKind k) { return k == DispatchKind::RoundRobin ? "round-robin" : "ready"; }

Dispatcher::Dispatcher(int devices, DispatchKind kind, std::vector<double> given_speeds)
    : G_(devices), kind_(kind), given_(!given_speeds.empty()), free_(static_cast<size_t>(std::max(devices, 0)), 0.0),
      recent_(free_.size(), {0.0, 0.0, 0.0}), jobs_(free_.size(), 0) {
    if (G_ < 1) throw Error("dispatch: " + std::to_string(G_) + " devices");
    if (given_ && static_cast<int>(given_speeds.size()) != G_)
        throw Error("dispatch: " + std::to_string(given_speeds.size()) + " device speeds for " + std::to_string(G_) + " devices");
    for (size_t d = 0; d < given_speeds.size(); ++d)
        if (!(given_speeds[d] > 0) || !std::isfinite(given_speeds[d]))
            throw Error("dispatch: device " + std::to_string(d) + "'s speed " + std::to_string(given_speeds[d]) + " is not positive");
    set_speeds(given_ ? std::move(given_speeds) : std::vector<double>(free_.size(), 1.0));
}

void Dispatcher::set_speeds(std::vector<double> raw) {
    const double top = *std::max_element(raw.begin(), raw.end());
    for (double & s : raw) {
        s /= top;
        if (s >= 1 - kSameSpeed) s = 1;
    }
    speeds_ = std::move(raw);
}

bool Dispatcher::uniform() const {
    return std::all_of(speeds_.begin(), speeds_.end(), [](double s) { return s == 1; });
}

void Dispatcher::begin_call(bool devices_idle) {
    prev_end_.clear();
    if (devices_idle) {
        const double now = *std::max_element(free_.begin(), free_.end());
        for (double & f : free_) f = now;
        ctl_ = std::max(ctl_, now);
    } else {
        ctl_ = std::max(ctl_, fused_end_);  // the previous call returned once its fused job was done
    }
}

// The model. The controller hands the job over once the device's thread has enqueued its previous job, which
// waited for the job before that to complete: at handoff, the device's third-last job has completed. Micro-batch
// m then starts after the device's micro-batch m-1 (or its last job) and after the call's previous job finished
// micro-batch m; it takes task_ms[m] / speed.
Dispatcher::Option Dispatcher::option(int device, const std::vector<double> & task_ms) const {
    const size_t uc = static_cast<size_t>(device);
    Option o{device, std::max(ctl_, recent_[uc][0]), std::vector<double>(task_ms.size())};
    double t = std::max(free_[uc], o.handoff);
    for (size_t m = 0; m < task_ms.size(); ++m) {
        const double ready = m < prev_end_.size() ? prev_end_[m] : (prev_end_.empty() ? 0.0 : prev_end_.back());
        t = std::max(t, ready) + task_ms[m] / speeds_[uc];
        o.ends[m] = t;
    }
    return o;
}

int Dispatcher::commit(Option o, bool fused) {
    const size_t ub = static_cast<size_t>(o.device);
    ptr_ = static_cast<uint64_t>(o.device) + 1;
    ctl_ = o.handoff;
    const double end = o.finish();
    free_[ub] = std::max(free_[ub], end);
    recent_[ub] = {recent_[ub][1], recent_[ub][2], end};
    if (fused) fused_end_ = end;
    prev_end_ = std::move(o.ends);
    ++jobs_[ub];
    return o.device;
}

int Dispatcher::pick(const std::vector<double> & task_ms, bool fused, const std::vector<char> * allowed) {
    if (allowed && allowed->size() != free_.size())
        throw Error("dispatch: " + std::to_string(allowed->size()) + " allowed flags for " + std::to_string(G_) + " devices");
    const bool by_finish = kind_ == DispatchKind::Ready && !uniform();
    std::optional<Option> best;
    for (int k = 0; k < G_; ++k) {  // the pointer's order breaks ties
        const int d = static_cast<int>((ptr_ + static_cast<uint64_t>(k)) % static_cast<uint64_t>(G_));
        if (allowed && !(*allowed)[static_cast<size_t>(d)]) continue;
        Option o = option(d, task_ms);
        if (!best || o.finish() < best->finish() * (1 - 1e-12)) best = std::move(o);
        if (!by_finish) break;
    }
    if (!best) throw Error("dispatch: no device may run the job");
    return commit(std::move(*best), fused);
}

void Dispatcher::assign(int device, const std::vector<double> & task_ms, bool fused) {
    if (device < 0 || device >= G_) throw Error("dispatch: no device " + std::to_string(device) + " of " + std::to_string(G_));
    commit(option(device, task_ms), fused);
}

double Dispatcher::predicted_end() const { return *std::max_element(free_.begin(), free_.end()); }

void Dispatcher::add_call(const std::vector<Launch> & launches) {
    if (given_ || launches.empty()) return;
    const int call = calls_seen_++;
    if (call == 0) return;  // start-up noise
    // The call's mean time per (key, device), then each pair's EMA.
    std::vector<std::vector<std::pair<double, int>>> sum;
    for (const Launch & l : launches) {
        if (l.key < 0 || l.device < 0 || l.device >= G_ || !(l.ms > 0) || !std::isfinite(l.ms)) continue;
        const size_t k = static_cast<size_t>(l.key);
        if (k >= sum.size()) sum.resize(k + 1, std::vector<std::pair<double, int>>(free_.size(), {0.0, 0}));
        sum[k][static_cast<size_t>(l.device)].first += l.ms;
        ++sum[k][static_cast<size_t>(l.device)].second;
    }
    if (sum.size() > pairs_.size()) pairs_.resize(sum.size(), std::vector<Pair>(free_.size()));
    for (size_t k = 0; k < sum.size(); ++k)
        for (size_t d = 0; d < free_.size(); ++d) {
            if (sum[k][d].second == 0) continue;
            const double x = sum[k][d].first / sum[k][d].second;
            Pair & p = pairs_[k][d];
            p.ms = p.last_call < 0 ? x : kSmoothing * p.ms + (1 - kSmoothing) * x;
            p.last_call = call;
        }
    fit_speeds();
}

void Dispatcher::fit_speeds() {
    const int newest = calls_seen_ - 1;
    auto live = [&](const Pair & p) { return p.last_call >= 0 && newest - p.last_call < kWindowCalls; };
    std::vector<double> log_s(free_.size(), 0.0), log_w(pairs_.size(), 0.0);
    // Weighted by the pairs' times: a long launch measures a device's speed; a few-microsecond one (an embedding
    // lookup) mostly measures the host's scheduling noise.
    for (int it = 0; it < 50; ++it) {
        for (size_t k = 0; k < pairs_.size(); ++k) {
            double acc = 0, wsum = 0;
            for (size_t d = 0; d < free_.size(); ++d)
                if (const Pair & p = pairs_[k][d]; live(p)) acc += p.ms * (std::log(p.ms) + log_s[d]), wsum += p.ms;
            log_w[k] = wsum > 0 ? acc / wsum : 0.0;
        }
        for (size_t d = 0; d < free_.size(); ++d) {
            double acc = 0, wsum = 0;
            for (size_t k = 0; k < pairs_.size(); ++k)
                if (const Pair & p = pairs_[k][d]; live(p)) acc += p.ms * (log_w[k] - std::log(p.ms)), wsum += p.ms;
            if (wsum > 0) log_s[d] = acc / wsum;
        }
        const double top = *std::max_element(log_s.begin(), log_s.end());
        for (double & v : log_s) v -= top;
    }
    std::vector<double> s(free_.size());
    for (size_t d = 0; d < s.size(); ++d) s[d] = std::exp(log_s[d]);
    set_speeds(std::move(s));
}

} // namespace rp
