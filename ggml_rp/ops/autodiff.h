// Reverse-mode autodiff at graph-build time.
//
// build_backward(ctx, g, loss, params) walks the forward nodes of g in reverse and appends gradient nodes
// (each op's rule sits beside its forward in ggml_rp/ops/<family>.cpp, written with other ops). Semantics:
//   - only `params` receive gradients. Each param owns a persistent f32 gradient tensor `grad` (same shape,
//     contiguous; set_param creates the struct, the caller gives it memory and zeroes it when it wants);
//   - the new nodes ACCUMULATE into param->grad (grad += dloss/dparam), so running the graph once per
//     micro-batch sums their gradients; nothing else is ever written (frozen weights get no gradient);
//   - gradients flow only through tensors that lie on a path from a param to the loss; subgraphs that cannot
//     reach a param are skipped;
//   - a param that does not influence the loss keeps its grad unchanged;
//   - the gradient nodes run in the order the rules created them (core/graph.h build_forward_in_creation_order):
//     the reverse walk's order, so each forward value is freed once the last rule reading it ran; an activation's
//     gradient of several contributions is summed in place into a buffer it owns (Backward::add). Neither changes
//     a result: the same nodes compute the same sums in the same order.
// Params are leafs: weights, LoRA factors, or a stage's input activations (then `grad` receives dL/dinput).
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rp {

// Marks the leaf t trainable and creates its gradient tensor struct when missing (f32, t's shape, named
// "grad.<name>", no data). Throws for a non-leaf or a non-f32 tensor (quantized weights are frozen).
Tensor * set_param(Context & ctx, Tensor * t);

// The same for an input activation whose gradient is wanted but which is not trained: it may be stored as f16 or
// bf16 (a layer's input kept in half precision); its gradient is f32 like every other.
Tensor * set_input_param(Context & ctx, Tensor * t);

// Differentiates the scalar f32 `loss` (1 element, flagged kFlagLoss | kFlagOutput here).
void build_backward(Context & ctx, Graph & g, Tensor * loss, const std::vector<Tensor *> & params);

// Same, seeded with a given gradient of a non-scalar output (f32, output's shape): for pipeline stages that
// receive dL/doutput from the next stage.
void build_backward(Context & ctx, Graph & g, Tensor * output, Tensor * output_grad, const std::vector<Tensor *> & params);

// What a backward rule sees. Rules read grad(node) and hand contributions to the node's sources.
class Backward {
public:
    Context & ctx;

    // The complete gradient of `node` (f32, node's shape; possibly a strided view).
    Tensor * grad(const Tensor * node) const;
    // True when t lies on a path to a param (only then may a rule build its gradient).
    bool needs(const Tensor * t) const { return needs_.count(t) != 0; }

    // Adds `contribution` (f32, t's shape, any strides) to t's gradient: in place when t owns its gradient (own_grad).
    void add(Tensor * t, Tensor * contribution);

    // For rules that can accumulate in place (out_prod, mul_mat_back_x, get_rows_back, lm_head_ce_back): fn(into)
    // must return a node computing `into + contribution` in place of `into` when into != nullptr, or the contribution
    // when into == nullptr. Params always get a non-null `into` (their grad buffer or the last node added to it); so
    // does a tensor that owns its gradient (own_grad). fresh: fn(nullptr) makes a new buffer that nothing else reads,
    // which t then owns, so that later contributions add into it in place.
    using AccumulateFn = std::function<Tensor *(Tensor * into)>;
    void accumulate(Tensor * t, const AccumulateFn & fn, bool fresh = false);

    // For rules whose contribution is zero outside a part of t (a window's): add(into) must add the part in place
    // into `into`, a t-shaped contiguous f32 buffer, and return the node that did. The parts are applied when t's
    // gradient is first read (t's own rule; a param's at the end), in the order they came, into the buffer t owns or
    // a zero-filled one taken after the last part: so the windows of one tensor (a split's parts, e.g. a fused
    // projection's query and gate) fill one buffer, which is not held from the first part's gradient to the last.
    // `part` is the part's gradient (ordering only: the buffer is taken after it).
    using PartFn = std::function<Tensor *(Tensor * into)>;
    void add_part(Tensor * t, Tensor * part, PartFn add);

    // Adds g, a fresh buffer (t's shape, contiguous f32) that nothing else reads, to t's gradient as add does;
    // when it becomes t's gradient as it is (t had none), t owns it.
    void set_own(Tensor * t, Tensor * g);
    // True when t's complete gradient is a buffer only t's gradient uses. t's own rule, the last reader of that
    // gradient, may then hand it on as a source's own (set_own: a reshape) or overwrite it once the rule's nodes
    // that read it have run (rms_norm_gated's dz).
    bool owns_grad(const Tensor * t) const { return own_grad(t) != nullptr; }

private:
    friend void build_backward(Context &, Graph &, Tensor *, Tensor *, const std::vector<Tensor *> &);
    explicit Backward(Context & c) : ctx(c) {}
    // t's gradient so far when it is a buffer that only t's gradient uses (owned_), else nullptr.
    Tensor * own_grad(const Tensor * t) const;
    // Applies t's pending parts (add_part).
    void apply_parts(Tensor * t);
    struct Part {
        Tensor * grad;
        PartFn add;
    };
    std::unordered_map<const Tensor *, std::vector<Part>> parts_;
    std::unordered_set<const Tensor *> needs_;
    std::unordered_set<const Tensor *> params_;
    std::unordered_map<const Tensor *, Tensor *> grads_;
    // Per tensor, the gradient in grads_ that only it uses (a fresh buffer: set_own, or a sum accumulate made), which
    // may be added into in place (own_grad). A gradient handed on as a contribution is its new tensor's too, unowned
    // (but a reshape hands on a gradient it owned as its source's own: set_own, nothing else reads it after).
    std::unordered_map<const Tensor *, Tensor *> owned_;
};

} // namespace rp
