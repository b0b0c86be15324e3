#include "ggml_rp/roundpipe/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace rp {

namespace {

std::string xml_escape(const std::string & s) {
    std::string out;
    for (const char c : s) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        default: out += c;
        }
    }
    return out;
}

struct Colour {
    double hue, sat;
};

// Pass -> hue. The pass is the part of the category before '/', or the whole category.
Colour pass_colour(const std::string & pass) {
    if (pass == "fwd" || pass == "forward") return {210, 65};
    if (pass == "fused" || pass == "fb") return {280, 55};
    if (pass == "bwd" || pass == "backward") return {20, 75};
    if (pass == "recompute") return {48, 85};
    if (pass == "opt" || pass == "optimizer") return {130, 50};
    return {0, 0};
}

// The first number inside the stage name ("F12" -> 12), or -1.
int stage_number(const std::string & stage) {
    for (size_t i = 0; i < stage.size(); ++i) {
        if (stage[i] >= '0' && stage[i] <= '9') return std::atoi(stage.c_str() + i);
    }
    return -1;
}

std::string fill_for(const std::string & cat, bool is_copy) {
    const size_t slash = cat.find('/');
    const std::string pass = slash == std::string::npos ? cat : cat.substr(0, slash);
    const std::string stage = slash == std::string::npos ? std::string() : cat.substr(slash + 1);
    const Colour c = pass_colour(pass);
    const int n = stage_number(stage);
    double light = n < 0 ? 50 : 32 + 8 * (n % 5);  // five shades, so neighbouring stages differ
    if (is_copy) light = std::min(88.0, light + 25);
    char buf[48];
    std::snprintf(buf, sizeof buf, "hsl(%.0f,%.0f%%,%.0f%%)", c.hue, c.sat, light);
    return buf;
}

std::string fmt(const char * f, double v) {
    char buf[48];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
double tick_step(double span, int target) {
    const double raw = span / std::max(1, target);
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * p >= raw) return m * p;
    }
    return 10 * p;
}

} // namespace

std::string timeline_svg(const Trace & trace, const TimelineOptions & opt) {
    Trace t = trace;
    t.name_defaults();

    std::set<std::pair<int, int>> rows_set;
    double t0 = 0, t1 = 0;
    bool any = false;
    std::set<std::string> passes;
    for (const TraceEvent & e : t.events) {
        rows_set.insert({e.pid, e.tid});
        if (!any) {
            t0 = e.ts_us;
            t1 = e.end_us();
            any = true;
        }
        t0 = std::min(t0, e.ts_us);
        t1 = std::max(t1, e.end_us());
        const size_t slash = e.cat.find('/');
        passes.insert(slash == std::string::npos ? e.cat : e.cat.substr(0, slash));
    }
    if (t1 <= t0) t1 = t0 + 1;
    const std::vector<std::pair<int, int>> rows(rows_set.begin(), rows_set.end());
    std::map<std::pair<int, int>, int> row_of;
    for (size_t i = 0; i < rows.size(); ++i) row_of[rows[i]] = static_cast<int>(i);

    const int label_w = 230, top = opt.title.empty() ? 30 : 50, legend_h = 40;
    const int rh = opt.row_height;
    const int height = top + static_cast<int>(rows.size()) * rh + 30 + legend_h;
    const int width = label_w + opt.width + 20;
    const double scale = opt.width / (t1 - t0);

    std::string s;
    s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    if (!opt.title.empty()) {
        s += "<text x=\"10\" y=\"22\" font-size=\"15\">" + xml_escape(opt.title) + "</text>\n";
    }

    // rows: labels and alternating background; a thicker line between devices
    for (size_t i = 0; i < rows.size(); ++i) {
        const int y = top + static_cast<int>(i) * rh;
        const auto [pid, tid] = rows[i];
        if (i % 2 == 0) {
            s += "<rect x=\"" + std::to_string(label_w) + "\" y=\"" + std::to_string(y) + "\" width=\"" +
                 std::to_string(opt.width) + "\" height=\"" + std::to_string(rh) + "\" fill=\"#f4f4f4\"/>\n";
        }
        if (i > 0 && rows[i - 1].first != pid) {
            s += "<line x1=\"0\" x2=\"" + std::to_string(width) + "\" y1=\"" + std::to_string(y) + "\" y2=\"" +
                 std::to_string(y) + "\" stroke=\"#888\"/>\n";
        }
        s += "<text x=\"6\" y=\"" + std::to_string(y + rh - 5) + "\">" +
             xml_escape(t.process_names[pid] + " " + t.thread_names[{pid, tid}]) + "</text>\n";
    }

    // time axis
    const int axis_y = top + static_cast<int>(rows.size()) * rh;
    const double span = t1 - t0;
    const bool in_ms = span >= 2000;
    const double unit = in_ms ? 1000.0 : 1.0;
    const double step = tick_step(span / unit, 10) * unit;
    for (double x = 0; x <= span + 1e-9; x += step) {
        const double px = label_w + x * scale;
        s += "<line x1=\"" + fmt("%.1f", px) + "\" x2=\"" + fmt("%.1f", px) + "\" y1=\"" + std::to_string(top) +
             "\" y2=\"" + std::to_string(axis_y + 4) + "\" stroke=\"#ddd\"/>\n";
        s += "<text x=\"" + fmt("%.1f", px) + "\" y=\"" + std::to_string(axis_y + 16) +
             "\" text-anchor=\"middle\">" + fmt("%g", x / unit) + (in_ms ? " ms" : " us") + "</text>\n";
    }

    // operations
    for (const TraceEvent & e : t.events) {
        const int row = row_of[{e.pid, e.tid}];
        const bool is_copy = e.tid != static_cast<int>(StreamKind::Compute);
        const double x = label_w + (e.ts_us - t0) * scale;
        const double w = std::max(0.5, e.dur_us * scale);
        const int y = top + row * rh + 2;
        s += "<rect x=\"" + fmt("%.2f", x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fmt("%.2f", w) +
             "\" height=\"" + std::to_string(rh - 4) + "\" fill=\"" + fill_for(e.cat, is_copy) +
             "\" stroke=\"#333\" stroke-width=\"0.3\"><title>" +
             xml_escape(e.name + " [" + e.cat + "] start " + fmt("%.1f", e.ts_us) + " us, " + fmt("%.1f", e.dur_us) +
                        " us") +
             "</title></rect>\n";
        if (w > 7.0 * static_cast<double>(e.name.size())) {
            s += "<text x=\"" + fmt("%.2f", x + 2) + "\" y=\"" + std::to_string(y + rh - 8) +
                 "\" font-size=\"9\" fill=\"white\">" + xml_escape(e.name) + "</text>\n";
        }
    }

    // legend: one swatch per pass
    int lx = label_w;
    const int ly = axis_y + 26;
    for (const std::string & p : passes) {
        s += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly) + "\" width=\"14\" height=\"10\" fill=\"" +
             fill_for(p + "/0", false) + "\"/>\n";
        s += "<text x=\"" + std::to_string(lx + 18) + "\" y=\"" + std::to_string(ly + 9) + "\">" +
             xml_escape(p.empty() ? "(none)" : p) + "</text>\n";
        lx += 40 + 7 * static_cast<int>(std::max<size_t>(p.size(), 6));
    }
    s += "<text x=\"" + std::to_string(lx + 10) + "\" y=\"" + std::to_string(ly + 9) +
         "\" fill=\"#555\">lighter boxes: copies; shade: stage</text>\n";
    s += "</svg>\n";
    return s;
}

} // namespace rp
