#include "models/train/finetune_report.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "ggml_rp/core/json.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace rp {

namespace {

// Round axis ticks: a step of 1, 2 or 5 times a power of ten giving at most `max_intervals` intervals over
// [lo, hi], the first tick at or below lo and the last at or above hi.
struct Ticks {
    double first = 0, step = 1;
    int count = 1;     // ticks: first + i * step, i < count
    int decimals = 0;  // what the step needs to print exactly
};

Ticks round_ticks(double lo, double hi, int max_intervals) {
    Ticks t;
    if (!(hi > lo)) hi = lo + 1;
    const double raw = (hi - lo) / max_intervals;
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        t.step = m * p;
        if (std::ceil(hi / t.step - 1e-9) - std::floor(lo / t.step + 1e-9) <= max_intervals) break;
    }
    const double a = std::floor(lo / t.step + 1e-9), b = std::ceil(hi / t.step - 1e-9);
    t.first = a * t.step;
    t.count = static_cast<int>(b - a) + 1;
    t.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(t.step) + 1e-9)));
    return t;
}

std::string tick_label(double v, int decimals) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, std::fabs(v) < 1e-12 ? 0.0 : v);
    return buf;
}

} // namespace

void write_loss_svg(const std::string & path, const TrainCurve & c, const LrSchedule * lr) {
    const double W = 720, H = 400, L = 60, R = lr ? 70 : 20, T = 30, B = 45;  // size and margins (of the loss panel)
    // Preference training and GRPO: a rewards panel below (PH high)
    const bool rewards = !c.reward_chosen.empty() || !c.reward.empty();
    const double PH = rewards ? 230 : 0;
    const size_t n = c.train_loss.size();
    double lo = 1e300, hi = -1e300;
    for (float v : c.train_loss)
        if (std::isfinite(v)) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
    for (float v : c.eval_loss)
        if (std::isfinite(v)) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
    if (lo > hi) lo = 0, hi = 1;
    const Ticks yt = round_ticks(lo, hi, 5);
    const double y0 = yt.first, y1 = yt.first + yt.step * (yt.count - 1);
    const double max_step = std::max<double>(1.0, static_cast<double>(n));
    auto X = [&](double step) { return L + (W - L - R) * step / max_step; };
    auto Y = [&](double v) { return T + (H - T - B) * (1.0 - (v - y0) / (y1 - y0)); };

    std::string s;
    char buf[512];
    std::snprintf(buf, sizeof buf, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H + PH);
    s += buf;
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    // The learning rate first, faint, on its own axis at the right (0 .. its largest value).
    if (lr && n > 0) {
        double lr_hi = 0;
        for (size_t i = 0; i < n; ++i) lr_hi = std::max(lr_hi, lr->lr(static_cast<int64_t>(i)));
        if (lr_hi > 0) {
            const Ticks lt = round_ticks(0, lr_hi, 4);
            const double l1 = lt.first + lt.step * (lt.count - 1);
            auto YL = [&](double v) { return T + (H - T - B) * (1.0 - v / l1); };
            s += "<g class=\"lr\" stroke=\"#999999\" fill=\"#999999\" opacity=\"0.6\">\n";
            std::snprintf(buf, sizeof buf, "<path d=\"M%.1f %.1f V%.1f\" fill=\"none\"/>\n", W - R, T, H - B);
            s += buf;
            for (int k = 0; k < lt.count; ++k) {
                const double v = lt.first + lt.step * k;
                std::snprintf(buf, sizeof buf, "<text class=\"lr-tick\" x=\"%.1f\" y=\"%.1f\" stroke=\"none\">%g</text>\n", W - R + 4, YL(v) + 4, v);
                s += buf;
            }
            std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" stroke=\"none\">lr</text>\n", W - R + 4, T - 8);
            s += buf;
            s += "<polyline fill=\"none\" stroke-width=\"1\" stroke-dasharray=\"4 3\" points=\"";
            for (size_t i = 0; i < n; ++i) {
                std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(static_cast<double>(i + 1)), YL(lr->lr(static_cast<int64_t>(i))));
                s += buf;
            }
            s += "\"/>\n</g>\n";
        }
    }
    // The axes of a panel from `top` to `bottom`: y ticks at round values (class y_class) with faint grid lines,
    // x ticks at a round step (1, 2 or 5 times a power of ten) giving at most 8 intervals over [0, steps].
    double tick = 1;
    while (max_step / tick > 8) {
        const double d = std::pow(10.0, std::floor(std::log10(tick)));
        tick = tick / d < 2 ? 2 * d : tick / d < 5 ? 5 * d : 10 * d;
    }
    auto axes = [&](double top, double bottom, const Ticks & t, auto y_of, const char * y_class) {
        std::snprintf(buf, sizeof buf, "<path d=\"M%.1f %.1f V%.1f H%.1f\" stroke=\"black\" fill=\"none\"/>\n", L, top, bottom, W - R);
        s += buf;
        for (int k = 0; k < t.count; ++k) {
            const double v = t.first + t.step * k;
            std::snprintf(buf, sizeof buf,
                          "<path d=\"M%.1f %.1f H%.1f\" stroke=\"#eeeeee\"/><text class=\"%s\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          L + 1, y_of(v), W - R, y_class, L - 4, y_of(v) + 4, tick_label(v, t.decimals).c_str());
            s += buf;
        }
        for (double st = 0; st <= max_step + 1e-9; st += tick) {
            std::snprintf(buf, sizeof buf,
                          "<path d=\"M%.1f %.1f v5\" stroke=\"black\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                          X(st), bottom, X(st), bottom + 18, st);
            s += buf;
        }
        std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, bottom + 39);
        s += buf;
    };
    axes(T, H - B, yt, Y, "y-tick");
    s += "<text x=\"70\" y=\"20\" fill=\"#1f77b4\">train loss</text><text x=\"160\" y=\"20\" fill=\"#ff7f0e\">validation loss</text>\n";
    if (lr) s += "<text x=\"280\" y=\"20\" fill=\"#999999\">learning rate (right axis)</text>\n";
    auto polyline_on = [&](auto y_of, const char * color, auto step_of, auto value_of, size_t count) {
        if (count == 0) return;
        s += "<polyline fill=\"none\" stroke=\"";
        s += color;
        s += "\" stroke-width=\"1.5\" points=\"";
        for (size_t i = 0; i < count; ++i) {
            if (!std::isfinite(value_of(i))) continue;  // a skipped step's non-finite loss: a gap, not a NaN coordinate
            std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(step_of(i)), y_of(value_of(i)));
            s += buf;
        }
        s += "\"/>\n";
    };
    auto polyline = [&](const char * color, auto step_of, auto value_of, size_t count) { polyline_on(Y, color, step_of, value_of, count); };
    polyline("#1f77b4", [](size_t i) { return static_cast<double>(i + 1); }, [&](size_t i) { return c.train_loss[i]; }, n);
    polyline("#ff7f0e", [&](size_t i) { return static_cast<double>(c.eval_step[i]); }, [&](size_t i) { return c.eval_loss[i]; },
             c.eval_loss.size());
    // The evaluation points, each with its value on hover; the best one (what --save-best keeps) ringed.
    const EvalProgress best = eval_progress(c);
    for (size_t i = 0; i < c.eval_loss.size(); ++i) {
        if (!std::isfinite(c.eval_loss[i])) continue;
        std::snprintf(buf, sizeof buf,
                      "<circle class=\"eval\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#ff7f0e\"><title>step %d: validation loss %.4f%s</title></circle>\n",
                      X(c.eval_step[i]), Y(c.eval_loss[i]), c.eval_step[i], c.eval_loss[i],
                      rewards ? "" : (", ppl " + format_perplexity(c.eval_loss[i])).c_str());
        s += buf;
    }
    if (best.best_step >= 0 && std::isfinite(best.best_loss)) {
        const double bx = X(static_cast<double>(best.best_step)), by = Y(best.best_loss);
        std::snprintf(buf, sizeof buf,
                      "<circle class=\"best\" cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>\n"
                      "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" text-anchor=\"%s\">best %.4f (step %lld)</text>\n",
                      bx, by, bx + (bx > W / 2 ? -10 : 10), by - 10, bx > W / 2 ? "end" : "start", best.best_loss,
                      static_cast<long long>(best.best_step));
        s += buf;
    }
    if (rewards && !c.reward.empty()) {  // GRPO: each step's mean reward
        double rlo = 0, rhi = 0;
        for (float v : c.reward)
            if (std::isfinite(v)) rlo = std::min(rlo, double(v)), rhi = std::max(rhi, double(v));
        const Ticks rt = round_ticks(rlo, rhi, 4);
        const double r0 = rt.first, r1 = rt.first + rt.step * (rt.count - 1), top = H + 25, bottom = H + PH - 45;
        auto YR = [&](double v) { return top + (bottom - top) * (1.0 - (v - r0) / (r1 - r0)); };
        axes(top, bottom, rt, YR, "reward-tick");
        std::snprintf(buf, sizeof buf, "<text x=\"70\" y=\"%.1f\" fill=\"#2ca02c\">reward (mean of the step's completions)</text>\n", top - 8);
        s += buf;
        polyline_on(YR, "#2ca02c", [](size_t i) { return static_cast<double>(i + 1); }, [&](size_t i) { return c.reward[i]; }, c.reward.size());
    } else if (rewards) {  // preference training: each step's mean rewards of the chosen and rejected answers, and their margin
        const size_t m = std::min(c.reward_chosen.size(), c.reward_rejected.size());
        double rlo = 0, rhi = 0;
        for (size_t i = 0; i < m; ++i)
            for (double v : {double(c.reward_chosen[i]), double(c.reward_rejected[i]), double(c.reward_chosen[i]) - c.reward_rejected[i]})
                if (std::isfinite(v)) rlo = std::min(rlo, v), rhi = std::max(rhi, v);
        const Ticks rt = round_ticks(rlo, rhi, 4);
        const double r0 = rt.first, r1 = rt.first + rt.step * (rt.count - 1), top = H + 25, bottom = H + PH - 45;
        auto YR = [&](double v) { return top + (bottom - top) * (1.0 - (v - r0) / (r1 - r0)); };
        axes(top, bottom, rt, YR, "reward-tick");
        std::snprintf(buf, sizeof buf,
                      "<text x=\"70\" y=\"%.1f\" fill=\"#2ca02c\">rewards/chosen</text><text x=\"190\" y=\"%.1f\" fill=\"#d62728\">"
                      "rewards/rejected</text><text x=\"320\" y=\"%.1f\" fill=\"#9467bd\">rewards/margins</text>\n",
                      top - 8, top - 8, top - 8);
        s += buf;
        auto step_of = [](size_t i) { return static_cast<double>(i + 1); };
        polyline_on(YR, "#2ca02c", step_of, [&](size_t i) { return c.reward_chosen[i]; }, m);
        polyline_on(YR, "#d62728", step_of, [&](size_t i) { return c.reward_rejected[i]; }, m);
        polyline_on(YR, "#9467bd", step_of, [&](size_t i) { return c.reward_chosen[i] - c.reward_rejected[i]; }, m);
    }
    s += "</svg>\n";

    write_file_atomically(path, s);
}

std::string format_perplexity(double loss) {
    const double ppl = std::exp(loss);
    if (std::isnan(ppl)) return "nan";
    if (std::isinf(ppl)) return "inf";
    char buf[64];
    std::snprintf(buf, sizeof buf, ppl < 1e6 ? "%.3f" : "%.3e", ppl);
    return buf;
}

std::string json_number(double v, const char * format) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

MetricsLog::MetricsLog(const std::string & path, bool append) : f_(path) {
    if (!append) return;
    std::FILE * in = std::fopen(path.c_str(), "rb");
    if (!in) return;  // nothing logged yet
    char buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) f_.write(buf, n);
    std::fclose(in);
    f_.flush();
}

void MetricsLog::save_copy() {
    f_.flush();
    std::FILE * in = std::fopen(f_.temp_path().c_str(), "rb");
    if (!in) throw Error(f_.temp_path() + ": cannot read the log back: " + std::strerror(errno));
    AtomicFile copy(f_.path(), ".copy.tmp");  // PATH.tmp is the log's own
    char buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) copy.write(buf, n);
    std::fclose(in);
    copy.commit();
}

namespace {

// ,"<prefix>rewards/chosen":x, ... (TRL's metric names)
std::string preference_json(const PreferenceStats & p, const char * prefix) {
    std::string s;
    auto add = [&](const char * name, double v) { s += std::string(",\"") + prefix + name + "\":" + json_number(v); };
    add("rewards/chosen", p.reward_chosen);
    add("rewards/rejected", p.reward_rejected);
    add("rewards/margins", p.margin);
    add("rewards/accuracies", p.accuracy);
    add("logps/chosen", p.logp_chosen);
    add("logps/rejected", p.logp_rejected);
    if (p.unpaired) add("kl", p.kl);
    return s;
}

// ,"reward":x, ... (TRL's GRPO metric names) and the step's first completion
std::string grpo_json(const GrpoStats & g) {
    std::string s;
    auto add = [&](const std::string & name, double v) {
        s += ',';
        json::append_string(s, name);
        s += ':';
        s += json_number(v);
    };
    add("reward", g.reward);
    add("reward_std", g.reward_std);
    for (const auto & [name, mean] : g.rewards) {
        add("rewards/" + name + "/mean", mean);
    }
    add("frac_reward_zero_std", g.frac_reward_zero_std);
    add("completions/mean_length", g.completion_mean);
    add("completions/min_length", static_cast<double>(g.completion_min));
    add("completions/max_length", static_cast<double>(g.completion_max));
    add("completions/clipped_ratio", g.clipped_ratio);
    add("kl", g.kl);
    add("clip_ratio/region_mean", g.clip_ratio);
    s += ",\"iteration\":" + std::to_string(g.iteration);
    add("rollout_seconds", g.rollout_seconds);
    add("rollout_tokens_per_s", g.rollout_seconds > 0 ? static_cast<double>(g.rollout_tokens) / g.rollout_seconds : 0.0);
    s += ",\"completion\":";
    json::append_string(s, g.sample);
    return s;
}

} // namespace

void MetricsLog::step(const StepReport & r, size_t rss_bytes) {
    std::string line = "{\"step\":" + std::to_string(r.step) + ",\"loss\":" + json_number(r.loss) +
                       ",\"lr\":" + json_number(r.lr, "%.6e") + ",\"grad_norm\":" + json_number(r.grad_norm) +
                       ",\"grad_norm_step\":" + (r.grad_norm_step > 0 ? std::to_string(r.grad_norm_step) : "null") +
                       ",\"tokens_per_s\":" + json_number(r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0, "%.1f");
    if (r.preference) line += preference_json(*r.preference, "");
    if (r.grpo) line += grpo_json(*r.grpo);
    if (r.skipped) line += ",\"skipped\":\"" + r.skip_reason + "\"";
    if (rss_bytes > 0) line += ",\"rss_bytes\":" + std::to_string(rss_bytes);
    f_.write(line + "}\n");
    f_.flush();
}

void MetricsLog::sample(int64_t step, const std::string & prompt, const std::string & completion) {
    std::string line = "{\"step\":" + std::to_string(step) + ",\"sample_prompt\":";
    json::append_string(line, prompt);
    line += ",\"sample\":";
    json::append_string(line, completion);
    f_.write(line + "}\n");
    f_.flush();
}

void MetricsLog::eval(int64_t step, double loss, const std::optional<PreferenceStats> & preference) {
    f_.write("{\"step\":" + std::to_string(step) + ",\"val_loss\":" + json_number(loss) +
             (preference ? preference_json(*preference, "eval_") : ",\"val_ppl\":" + json_number(std::exp(loss), "%.4f")) + "}\n");
    f_.flush();
}

} // namespace rp
