#include "ggml_rp/ops/autodiff.h"

#include "ggml_rp/ops/op_table.h"
#include "ggml_rp/ops/binary.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/view.h"
#include "base/error.h"

#include <cassert>


namespace rp {

namespace {

Tensor * mark_param(Context & ctx, Tensor * t) {
    t->flags |= kFlagParam;
    if (!t->grad) {
        t->grad = ctx.new_tensor_like(DType::F32, t);
        t->grad->name = "grad." + display_name(t);
    }
    if (t->grad->type != DType::F32 || !same_shape(t->grad, t) || !t->grad->is_contiguous())
        throw Error("set_param: gradient " + describe(t->grad) + " of " + describe(t) + " must be contiguous f32 of the same shape");
    return t;
}

} // namespace

Tensor * set_param(Context & ctx, Tensor * t) {
    if (!t->is_leaf()) throw Error("set_param: " + describe(t) + " is not a leaf (only weights and inputs can be params)");
    if (t->type != DType::F32)
        throw Error("set_param: " + describe(t) + " is not f32; only f32 tensors can be trained (quantized and "
                    "half-precision weights stay frozen; train LoRA factors or an f32 copy)");
    return mark_param(ctx, t);
}

Tensor * set_input_param(Context & ctx, Tensor * t) {
    if (!t->is_leaf()) throw Error("set_input_param: " + describe(t) + " is not a leaf");
    if (!dtype_is_float(t->type)) throw Error("set_input_param: " + describe(t) + " is not f32, f16 or bf16");
    return mark_param(ctx, t);
}

Tensor * Backward::grad(const Tensor * node) const {
    auto it = grads_.find(node);
    return it == grads_.end() ? nullptr : it->second;
}

void Backward::accumulate(Tensor * t, const AccumulateFn & fn, bool fresh) {
    if (!needs(t)) return;
    const bool owned = own_grad(t) != nullptr;
    Tensor *& cur = grads_[t];
    if (params_.count(t)) {
        // Params accumulate in place into their persistent buffer: a chain of in-place nodes.
        cur = fn(cur ? cur : t->grad);
    } else if (!cur) {
        cur = fn(nullptr);
        if (fresh) owned_[t] = cur;
    } else if (owned) {
        // A buffer only t's gradient uses: the contribution is added into it in place (by the rule's own node).
        cur = fn(cur);
        owned_[t] = cur;
    } else {
        // A gradient that may be another tensor's too (a contribution handed on as it is) is not updated in place:
        // the sum is a new node, which nothing else reads (t owns it).
        cur = rp::add(ctx, cur, fn(nullptr));
        owned_[t] = cur;
    }
}

Tensor * Backward::own_grad(const Tensor * t) const {
    if (params_.count(t)) return nullptr;
    Tensor * g = grad(t);
    const auto it = owned_.find(t);
    return g && it != owned_.end() && it->second == g ? g : nullptr;
}

void Backward::set_own(Tensor * t, Tensor * g) {
    if (!needs(t)) return;
    const Tensor * before = grad(t);
    add(t, g);
    if (!before && !params_.count(t)) owned_[t] = grad(t);  // g itself is t's gradient now
}

void Backward::add_part(Tensor * t, Tensor * part, PartFn add) {
    if (!needs(t)) return;
    assert(t->is_contiguous() && t->type == DType::F32);  // (the window rule refuses other sources, naming them)
    parts_[t].push_back({part, std::move(add)});
}

void Backward::apply_parts(Tensor * t) {
    const auto it = parts_.find(t);
    if (it == parts_.end()) return;
    const std::vector<Part> parts = std::move(it->second);
    parts_.erase(it);
    // Into the buffer t owns, else a zero-filled one (the bits of a zero-filled buffer per part summed: each element
    // is 0 + the part's, never -0, so adding a 0 changes none). Each addition is ordered before the next reads the
    // buffer (after).
    Tensor * owned = own_grad(t);
    Tensor * buf = owned ? owned : fill_after(ctx, t, 0.0f, parts.back().grad);
    for (const Part & p : parts) buf = after(ctx, buf, p.add(buf));
    if (owned) {
        grads_[t] = buf;
        owned_[t] = buf;
    } else {
        set_own(t, buf);
    }
}

void Backward::add(Tensor * t, Tensor * contribution) {
    if (!same_shape(t, contribution) || contribution->type != DType::F32)
        throw Error("backward: gradient " + describe(contribution) + " does not match " + describe(t));
    accumulate(t, [&](Tensor * into) { return into ? add_inplace(ctx, into, contribution) : contribution; });
}

namespace {

void apply_rule(Backward & b, Tensor * node) {
    const OpDesc & d = op_desc(node->op);
    if (!d.backward)
        throw Error(std::string("build_backward: op ") + d.name + " (tensor " + describe(node) + ") has no backward rule");
    d.backward(b, node);
}

} // namespace

void build_backward(Context & ctx, Graph & g, Tensor * output, Tensor * output_grad, const std::vector<Tensor *> & params) {
    if (!output || !g.contains(output)) throw Error("build_backward: the output is not in the graph (build_forward it first)");
    if (output->type != DType::F32) throw Error("build_backward: output " + describe(output) + " is not f32");
    if (!output_grad || output_grad->type != DType::F32 || !same_shape(output, output_grad))
        throw Error("build_backward: seed gradient " + describe(output_grad) + " does not match output " + describe(output));

    Backward b(ctx);
    for (Tensor * p : params) {
        if (!p) throw Error("build_backward: null param");
        if (!(p->flags & kFlagParam)) set_param(ctx, p);  // (set_input_param's half-precision activations are marked)
        b.params_.insert(p);
        b.needs_.insert(p);
    }
    // Forward nodes only: the rules below append new nodes that must not be visited.
    const std::vector<Tensor *> forward = g.nodes;
    for (Tensor * n : forward)
        for (const Tensor * s : n->src)
            if (s && b.needs(s)) { b.needs_.insert(n); break; }
    if (!b.needs(output)) return;  // no param reaches the output: nothing to accumulate

    b.grads_[output] = output_grad;
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
        Tensor * n = *it;
        if (!b.needs(n)) continue;
        b.apply_parts(n);
        if (!b.grad(n)) continue;  // not on a path param -> output
        apply_rule(b, n);
    }
    std::vector<Tensor *> last;
    for (Tensor * p : params) {
        b.apply_parts(p);
        if (Tensor * l = b.grad(p)) last.push_back(l);
    }
    build_forward_in_creation_order(g, last);
}

void build_backward(Context & ctx, Graph & g, Tensor * loss, const std::vector<Tensor *> & params) {
    if (!loss || loss->nelements() != 1)
        throw Error("build_backward: the loss " + describe(loss) + " must be a scalar (1 element)");
    loss->flags |= kFlagLoss | kFlagOutput;
    Tensor * one = fill(ctx, loss, 1.0f);
    one->name = "grad.seed";
    build_backward(ctx, g, loss, one, params);
}

} // namespace rp
