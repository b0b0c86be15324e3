#include "ggml_rp/roundpipe/plan.h"

#include "base/error.h"

#include <cstdlib>

namespace rp {

namespace {

std::string range_str(const LayerRange & r) {
    std::string s = "[";
    s += std::to_string(r.begin);
    s += ',';
    s += std::to_string(r.end);
    s += ')';
    return s;
}

} // namespace

std::string Plan::describe() const {
    std::string s = "F";
    for (const LayerRange & r : fwd) {
        s += ' ';
        s += range_str(r);
    }
    if (fwd.empty()) s += " (none)";
    if (!bwd.empty()) {
        s += " | FB ";
        s += range_str(bwd.front());
    }
    s += " | B";
    for (size_t i = 1; i < bwd.size(); ++i) {
        s += ' ';
        s += range_str(bwd[i]);
    }
    if (bwd.size() <= 1) s += " (none)";
    if (grain == RecomputeGrain::Layer) s += " (layer grain)";
    return s;
}

void validate_plan(const Plan & plan, int num_layers) {
    if (num_layers <= 0) throw Error("plan: the model has no layers");
    if (plan.bwd.empty()) throw Error("plan: no fused tail stage (the backward plan is empty)");
    const LayerRange & fb = plan.bwd.front();
    if (fb.size() <= 0) throw Error("plan: fused tail stage " + range_str(fb) + " is empty");
    if (fb.end != num_layers) {
        throw Error("plan: fused tail stage " + range_str(fb) + " must end at the last layer (" +
                    std::to_string(num_layers) + " layers)");
    }
    const int e = fb.begin;
    int next = 0;
    for (size_t i = 0; i < plan.fwd.size(); ++i) {
        const LayerRange & r = plan.fwd[i];
        const std::string name = "forward stage F" + std::to_string(i) + " " + range_str(r);
        if (r.size() <= 0) throw Error("plan: " + name + " is empty");
        if (r.begin != next) {
            throw Error("plan: " + name + " should start at layer " + std::to_string(next));
        }
        next = r.end;
    }
    if (next != e) {
        throw Error("plan: forward stages end at layer " + std::to_string(next) + " but the fused tail starts at " +
                    std::to_string(e) + " (last forward layer + 1 must be the first layer of FB)");
    }
    int top = e;  // backward stages walk down from FB to layer 0
    for (size_t i = 1; i < plan.bwd.size(); ++i) {
        const LayerRange & r = plan.bwd[i];
        const std::string name = "backward stage B" + std::to_string(i) + " " + range_str(r);
        if (r.size() <= 0) throw Error("plan: " + name + " is empty");
        if (r.end != top) throw Error("plan: " + name + " should end at layer " + std::to_string(top));
        top = r.begin;
    }
    if (top != 0) {
        throw Error("plan: backward stages stop at layer " + std::to_string(top) + " instead of covering down to 0");
    }
}

Plan plan_from_sizes(const std::vector<int> & fwd_sizes, const std::vector<int> & bwd_sizes, RecomputeGrain grain) {
    if (bwd_sizes.empty()) throw Error("plan: no backward stages given (the first one is the fused tail)");
    int total_fwd = 0;
    for (int n : fwd_sizes) total_fwd += n;
    Plan p;
    p.grain = grain;
    int at = 0;
    for (int n : fwd_sizes) {
        p.fwd.push_back({at, at + n});
        at += n;
    }
    const int layers = total_fwd + bwd_sizes.front();
    p.bwd.push_back({total_fwd, layers});
    int top = total_fwd;
    for (size_t i = 1; i < bwd_sizes.size(); ++i) {
        p.bwd.push_back({top - bwd_sizes[i], top});
        top -= bwd_sizes[i];
    }
    validate_plan(p, layers);
    return p;
}

namespace {

// "3,3,2x4" -> {3, 3, 2, 2, 2, 2}; `what` names the list in errors.
std::vector<int> parse_counts(const std::string & text, const std::string & what) {
    std::vector<int> out;
    for (size_t pos = 0; pos <= text.size();) {
        const size_t comma = text.find(',', pos);
        const size_t end_item = comma == std::string::npos ? text.size() : comma;
        const std::string item = text.substr(pos, end_item - pos);
        const size_t x = item.find('x');
        char * end = nullptr;
        const long n = std::strtol(item.c_str(), &end, 10);
        long rep = 1;
        if (x != std::string::npos) {
            char * end2 = nullptr;
            rep = std::strtol(item.c_str() + x + 1, &end2, 10);
            if (x == 0 || end != item.c_str() + x || *end2 != '\0' || rep < 1) throw Error(what + ": bad item '" + item + "'");
        } else if (item.empty() || *end != '\0') {
            throw Error(what + ": bad item '" + item + "'");
        }
        if (n < 0 || n > 100000 || rep > 100000) throw Error(what + ": item '" + item + "' out of range");
        out.insert(out.end(), static_cast<size_t>(rep), static_cast<int>(n));
        pos = end_item + 1;
    }
    return out;
}

} // namespace

Plan plan_from_decoder_counts(const std::string & text) {
    const size_t bar = text.find('|');
    if (bar == std::string::npos) throw Error("partition '" + text + "': expected \"forward|backward\"");
    std::vector<int> f = parse_counts(text.substr(0, bar), "partition (forward)");
    std::vector<int> b = parse_counts(text.substr(bar + 1), "partition (backward)");
    if (f.empty() || b.size() < 2) throw Error("partition '" + text + "': need forward stages and FB plus backward stages");
    f.front() += 1;  // the prefix rides in F0
    b.front() += 1;  // the postfix is in FB
    b.back() += 1;   // and the prefix in the last backward stage
    try {
        return plan_from_sizes(f, b);
    } catch (const Error & e) {
        throw Error("partition '" + text + "': " + e.what());
    }
}

std::string decoder_counts(const Plan & p) {
    std::string s;
    for (size_t i = 0; i < p.fwd.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(p.fwd[i].size() - (i == 0 ? 1 : 0));
    }
    s += '|';
    for (size_t i = 0; i < p.bwd.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(p.bwd[i].size() - (i == 0 ? 1 : 0) - (i + 1 == p.bwd.size() && i > 0 ? 1 : 0));
    }
    return s;
}

} // namespace rp
