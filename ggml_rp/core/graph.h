// A lazy computation graph: the nodes reachable from the tensors passed to build_forward, in an order where
// every node comes after its sources (depth-first post-order, sources visited in slot order, so the order is
// a pure function of how the graph was recorded).
#pragma once

#include "ggml_rp/core/tensor.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace rp {

struct Graph {
    std::vector<Tensor *> nodes;  // op != NONE (views included), topological order
    std::vector<Tensor *> leafs;  // op == NONE: weights, inputs, gradient buffers
    std::unordered_set<const Tensor *> visited;

    bool contains(const Tensor * t) const { return visited.count(t) != 0; }
};

// Appends t and every tensor it depends on that is not yet in g. Calling it again with another tensor
// extends the same graph (several outputs, or the gradient nodes of build_backward).
void build_forward(Graph & g, Tensor * t);

// The same for several roots at once, but in the order the tensors were created (Tensor::id; a source always
// comes before its consumer): build_backward's order. Its rules create each gradient where the reverse walk meets
// its node, so a forward value is read and freed layer by layer back from the output, where a depth-first walk
// from each parameter's gradient would first compute everything the first parameter needs and hold the rest.
void build_forward_in_creation_order(Graph & g, const std::vector<Tensor *> & roots);

// Drops the nodes whose results nothing reads: keeps the outputs (kFlagOutput), every node that writes in place
// into a leaf's memory or an output's (a view that computes: a gradient accumulating into its parameter's buffer)
// and everything those read. For a backward program that recomputes its layer's forward: the layer's output and
// what feeds only it (the last projections and the residual sum, whose gradients need no forward value) are
// not computed. The remaining nodes keep their order; no result changes.
void prune_unused(Graph & g);

// One line per leaf and node: index, op, type, shape, name, sources, view/alloc info.
std::string graph_dump_text(const Graph & g);
// Graphviz DOT: leafs as ellipses, nodes as boxes, edges from source to consumer.
std::string graph_dump_dot(const Graph & g);

} // namespace rp
