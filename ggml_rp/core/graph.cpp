#include "ggml_rp/core/graph.h"

#include <cstdio>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace rp {

void build_forward(Graph & g, Tensor * root) {
    if (!root || g.contains(root)) return;
    // Iterative DFS (graphs of a 70-layer model are deep enough to worry about recursion).
    std::vector<std::pair<Tensor *, int>> stack;
    g.visited.insert(root);
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
        auto & [t, next] = stack.back();
        if (next < kMaxSrc) {
            Tensor * s = t->src[next++];
            if (s && !g.contains(s)) {
                g.visited.insert(s);
                stack.emplace_back(s, 0);
            }
            continue;
        }
        if (t->op == Op::NONE) g.leafs.push_back(t);
        else g.nodes.push_back(t);
        stack.pop_back();
    }
}

void build_forward_in_creation_order(Graph & g, const std::vector<Tensor *> & roots) {
    // The new tensors, numbered in the order a depth-first walk finds them (the tie-break of equal ids: tensors of
    // different contexts), and for each its consumers among them and how many of its sources are still to come.
    std::vector<Tensor *> found;
    std::unordered_map<const Tensor *, size_t> index;
    for (Tensor * r : roots) {
        if (!r || g.contains(r) || index.count(r)) continue;
        std::vector<Tensor *> stack{r};
        index.emplace(r, found.size());
        found.push_back(r);
        while (!stack.empty()) {
            Tensor * t = stack.back();
            stack.pop_back();
            for (Tensor * s : t->src)
                if (s && !g.contains(s) && index.emplace(s, found.size()).second) {
                    found.push_back(s);
                    stack.push_back(s);
                }
        }
    }
    std::vector<int> waiting(found.size(), 0);
    std::vector<std::vector<size_t>> consumers(found.size());
    for (size_t i = 0; i < found.size(); ++i)
        for (const Tensor * s : found[i]->src)
            if (auto it = s ? index.find(s) : index.end(); it != index.end()) {
                ++waiting[i];
                consumers[it->second].push_back(i);
            }
    // Kahn's algorithm, the ready tensor created first taken first.
    auto later = [&](size_t a, size_t b) {
        return found[a]->id != found[b]->id ? found[a]->id > found[b]->id : a > b;
    };
    std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(later);
    for (size_t i = 0; i < found.size(); ++i)
        if (waiting[i] == 0) ready.push(i);
    while (!ready.empty()) {
        const size_t i = ready.top();
        ready.pop();
        Tensor * t = found[i];
        g.visited.insert(t);
        if (t->op == Op::NONE) g.leafs.push_back(t);
        else g.nodes.push_back(t);
        for (size_t c : consumers[i])
            if (--waiting[c] == 0) ready.push(c);
    }
}

void prune_unused(Graph & g) {
    std::unordered_set<const Tensor *> need;
    std::vector<const Tensor *> stack;
    // A computing view writes into its root's memory: kept when that memory outlives the graph (a leaf's: a gradient
    // accumulating into its parameter's buffer) or is an output; one into an intermediate node (a LoRA branch added
    // into W x) is a value like any other, computed only if something reads it.
    auto writes_outside = [](const Tensor * n) {
        const Tensor * root = n;
        while (root->view_src) root = root->view_src;
        return root->op == Op::NONE || root->has_flag(kFlagOutput);
    };
    for (const Tensor * n : g.nodes)
        if (n->has_flag(kFlagOutput) || (n->is_view() && n->op != Op::VIEW && writes_outside(n))) stack.push_back(n);
    while (!stack.empty()) {
        const Tensor * t = stack.back();
        stack.pop_back();
        if (t->op == Op::NONE || !need.insert(t).second) continue;
        for (const Tensor * s : t->src)
            if (s) stack.push_back(s);
        if (t->view_src) stack.push_back(t->view_src);
    }
    std::vector<Tensor *> kept;
    kept.reserve(g.nodes.size());
    for (Tensor * n : g.nodes) {
        if (need.count(n)) kept.push_back(n);
        else g.visited.erase(n);
    }
    g.nodes = std::move(kept);
}

namespace {

std::string ref(const Tensor * t) {
    std::string s(1, '#');  // appended: GCC 12 warns falsely (-Wrestrict) on "#" + std::string&&
    s += std::to_string(t->id);
    return s;
}

} // namespace

std::string graph_dump_text(const Graph & g) {
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf, "graph: %zu leafs, %zu nodes\n", g.leafs.size(), g.nodes.size());
    out += buf;
    for (const Tensor * t : g.leafs) {
        std::snprintf(buf, sizeof buf, "  leaf %-5s %-5s %-22s %s%s%s\n", ref(t).c_str(), dtype_name(t->type),
                      shape_str(t).c_str(), display_name(t).c_str(), t->has_flag(kFlagParam) ? " [param]" : "",
                      t->has_flag(kFlagInput) ? " [input]" : "");
        out += buf;
    }
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Tensor * t = g.nodes[i];
        std::string srcs;
        for (const Tensor * s : t->src)
            if (s) srcs += (srcs.empty() ? "" : ", ") + ref(s);
        std::string extra;
        if (t->is_view()) extra = " (view of " + ref(t->view_src) + " +" + std::to_string(t->view_offs) + ")";
        if (t->has_flag(kFlagOutput)) extra += " [output]";
        if (t->has_flag(kFlagLoss)) extra += " [loss]";
        std::snprintf(buf, sizeof buf, "  %4zu %-5s %-15s %-5s %-22s %s <- %s%s\n", i, ref(t).c_str(), op_name(t->op),
                      dtype_name(t->type), shape_str(t).c_str(), display_name(t).c_str(), srcs.c_str(), extra.c_str());
        out += buf;
    }
    return out;
}

std::string graph_dump_dot(const Graph & g) {
    std::string out = "digraph G {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n";
    auto label = [](const Tensor * t) {
        std::string s = display_name(t) + "\\n" + op_name(t->op) + " " + dtype_name(t->type) + " " + shape_str(t);
        std::string esc;
        for (char c : s) {
            if (c == '"') esc += "\\\"";
            else esc += c;
        }
        return esc;
    };
    for (const Tensor * t : g.leafs) {
        out += "  t" + std::to_string(t->id) + " [shape=ellipse, label=\"" + label(t) + "\"" +
               (t->has_flag(kFlagParam) ? ", style=filled, fillcolor=\"#ffe0a0\"" : "") + "];\n";
    }
    for (const Tensor * t : g.nodes) {
        out += "  t" + std::to_string(t->id) + " [shape=box, label=\"" + label(t) + "\"" +
               (t->is_view() ? ", style=dashed" : "") + "];\n";
        for (const Tensor * s : t->src)
            if (s) out += "  t" + std::to_string(s->id) + " -> t" + std::to_string(t->id) + ";\n";
    }
    out += "}\n";
    return out;
}

} // namespace rp
