#include "models/finetune_report.h"

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

void write_loss_svg(const std::string & path, const TrainCurve & c) {
    const double W = 720, H = 400, L = 60, R = 20, T = 30, B = 45;  // size and margins
    const size_t n = c.train_loss.size();
    float lo = 1e30f, hi = -1e30f;
    for (float v : c.train_loss) lo = std::min(lo, v), hi = std::max(hi, v);
    for (float v : c.eval_loss) lo = std::min(lo, v), hi = std::max(hi, v);
    if (lo > hi) lo = 0, hi = 1;
    if (hi - lo < 1e-6f) hi = lo + 1e-6f;
    const double max_step = std::max<double>(1.0, static_cast<double>(n));
    auto X = [&](double step) { return L + (W - L - R) * step / max_step; };
    auto Y = [&](double v) { return T + (H - T - B) * (1.0 - (v - lo) / (hi - lo)); };

    std::string s;
    char buf[256];
    std::snprintf(buf, sizeof buf, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    s += buf;
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    std::snprintf(buf, sizeof buf, "<path d=\"M%.1f %.1f V%.1f H%.1f\" stroke=\"black\" fill=\"none\"/>\n", L, T, H - B, W - R);
    s += buf;
    for (int k = 0; k <= 4; ++k) {  // y ticks
        const double v = lo + (hi - lo) * k / 4.0;
        std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n", L - 4, Y(v) + 4, v);
        s += buf;
    }
    // x ticks: a round step (1, 2 or 5 times a power of ten) giving at most 8 intervals over [0, steps].
    double tick = 1;
    while (max_step / tick > 8) {
        const double d = std::pow(10.0, std::floor(std::log10(tick)));
        tick = tick / d < 2 ? 2 * d : tick / d < 5 ? 5 * d : 10 * d;
    }
    for (double st = 0; st <= max_step + 1e-9; st += tick) {
        std::snprintf(buf, sizeof buf,
                      "<path d=\"M%.1f %.1f v5\" stroke=\"black\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                      X(st), H - B, X(st), H - B + 18, st);
        s += buf;
    }
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 6);
    s += buf;
    s += "<text x=\"70\" y=\"20\" fill=\"#1f77b4\">train loss</text><text x=\"160\" y=\"20\" fill=\"#ff7f0e\">validation loss</text>\n";
    auto polyline = [&](const char * color, auto step_of, auto value_of, size_t count) {
        if (count == 0) return;
        s += "<polyline fill=\"none\" stroke=\"";
        s += color;
        s += "\" stroke-width=\"1.5\" points=\"";
        for (size_t i = 0; i < count; ++i) {
            std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(step_of(i)), Y(value_of(i)));
            s += buf;
        }
        s += "\"/>\n";
    };
    polyline("#1f77b4", [](size_t i) { return static_cast<double>(i + 1); }, [&](size_t i) { return c.train_loss[i]; }, n);
    polyline("#ff7f0e", [&](size_t i) { return static_cast<double>(c.eval_step[i]); }, [&](size_t i) { return c.eval_loss[i]; },
             c.eval_loss.size());
    for (size_t i = 0; i < c.eval_loss.size(); ++i) {
        std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#ff7f0e\"/>\n", X(c.eval_step[i]), Y(c.eval_loss[i]));
        s += buf;
    }
    s += "</svg>\n";

    write_file_atomically(path, s);
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

void MetricsLog::step(const StepReport & r, size_t rss_bytes) {
    std::string line = "{\"step\":" + std::to_string(r.step) + ",\"loss\":" + json_number(r.loss) +
                       ",\"lr\":" + json_number(r.lr, "%.6e") + ",\"grad_norm\":" + json_number(r.grad_norm) +
                       ",\"grad_norm_step\":" + (r.grad_norm_step > 0 ? std::to_string(r.grad_norm_step) : "null") +
                       ",\"tokens_per_s\":" + json_number(r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0, "%.1f");
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

void MetricsLog::eval(int64_t step, double loss) {
    f_.write("{\"step\":" + std::to_string(step) + ",\"val_loss\":" + json_number(loss) + ",\"val_ppl\":" +
             json_number(std::exp(loss), "%.4f") + "}\n");
    f_.flush();
}

} // namespace rp
