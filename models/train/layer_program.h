// The Trainer's per-layer programs from the inside (models/train/trainer.h keeps these types private): a
// layer's tensors rebound to a call's memory, the buffers a call passes, a program's graphs as built once per
// shape and replayed, and host training's kept layer. Shared by layer_programs.cpp (building, replaying and
// running the programs) and host_step.cpp (host training's sweep with its kept layers); nothing else includes it.
#pragma once

#include "models/train/trainer.h"

#include "ggml_rp/ggml_rp.h"

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace rp {

// A layer's tensors rebound to memory: copies of the seq tensors in one program's context, the weights struct
// and LoRA set the graph builders read, and the trainable copies (with grads) for build_backward.
struct Trainer::Bound {
    ModelWeights w{};
    LayerWeights layer{};
    LoraSet lora;
    std::vector<Tensor *> params;
    std::vector<Tensor *> by_seq;  // the copy of seq_tensors(layer)[i], pointed at each call's LayerMemory
};

// The buffers a per-layer program reads and writes in one call (roundpipe/program.h's arguments).
// Held: device memory the runner holds across the program's graphs (GraphRunner::hold; a streamed head's state).
enum class Trainer::Arg : uint8_t { In, Out, Din, Dout, Labels, Loss, Held };

struct Trainer::CallArgs {
    const void * in = nullptr;
    void * out = nullptr;
    void * din = nullptr;
    const void * dout = nullptr;  // the chunked backward also uses it as scratch (program.h)
    const int32_t * labels = nullptr;
    float * loss = nullptr;
    void * held = nullptr;
    // Byte `offset` of buffer a. (Integer arithmetic: a runner that only measures passes null buffers.)
    void * at(Arg a, size_t offset) const {
        const void * base = a == Arg::In ? in : a == Arg::Out ? out : a == Arg::Din ? din : a == Arg::Dout ? dout
                            : a == Arg::Labels ? static_cast<const void *>(labels) : a == Arg::Held ? held
                                                                                  : static_cast<const void *>(loss);
        return reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(base) + offset);
    }
};

// A per-layer program: its layer's tensors, and its graphs, built once for a shape (ProgramKey) and replayed
// with every call's memory: leafs over the call's buffers are recorded with their buffer and byte offset, and
// each graph (a Step) with the buffers zeroed before it runs, the positions it reads (uploaded for it: an
// upload lives until the next graph has run) and the results copied out of it.
struct Trainer::Program {
    struct ArgLeaf {
        Tensor * t;
        Arg arg;
        size_t offset;
        bool grad;  // the leaf's gradient buffer (t->grad->data), not its data
    };
    struct Zero {
        Arg arg;
        size_t offset, bytes;
    };
    struct Copy {
        Arg arg;
        size_t offset;
        const Tensor * node;
    };
    // A leaf uploaded for its step from a vocabulary matrix left on the host (MicroBatchInfo::vocab_on_host; the
    // tensor as bound, its data the host bytes): `bytes` from byte `offset` (a head range), or the rows of the
    // micro-batch's tokens (a gathered embedding: `ids` then gets 0 .. n-1, the rows' lookup).
    struct Upload {
        Tensor * leaf;
        const Tensor * from;
        size_t offset = 0, bytes = 0;
        Tensor * ids = nullptr;
    };
    struct Step {
        Graph g;
        std::vector<Zero> zeros;
        std::vector<TokenPositions> positions;
        std::vector<Copy> copies;
        std::vector<Upload> uploads;
        Tensor * sequence_values = nullptr;  // uploaded from MicroBatchInfo::sequence_values (preference heads)
        Tensor * answer_slots = nullptr;     // each token's answer slot (packed preference heads; answer_slot_ids)
        AllocPlan plan;  // made at the first run (GraphRunner::run_planned)
    };

    Context ctx;
    int layer;
    Bound b;
    bool grads;
    DType boundary;  // the hidden state's type in In / Out (FinetuneConfig::boundary_type)
    std::vector<ArgLeaf> args;
    size_t held_bytes = 0;  // what its graphs keep across them (Arg::Held; 0: nothing held)
    std::deque<Step> steps;  // (references to a step stay valid while later ones are added)

    Program(const Trainer & tr, int layer_index, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb)
        : layer(layer_index), b(tr.bind(ctx, layer_index, mem, with_grads, mb)), grads(with_grads), boundary(tr.cfg_.boundary_type) {}

    Step & new_step() { return steps.emplace_back(); }
    // A leaf over buffer a from byte offset.
    Tensor * leaf(DType type, Arg a, size_t offset, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
        Tensor * t = ctx.new_tensor(type, ne0, ne1, ne2);
        t->flags |= kFlagInput;
        args.push_back({t, a, offset, false});
        return t;
    }
    // A hidden-state leaf that is a parameter of the graph: its gradient goes to buffer g from byte goffset,
    // zeroed before step s runs when `zero` (else it holds what the gradient adds to). Of type `type` (a layer
    // boundary's: `boundary`); the graph reads it through as_f32, the gradient is f32 whatever the type.
    Tensor * hidden_param(Step & s, Arg a, size_t offset, Arg g, size_t goffset, int64_t ne0, int64_t ne1, int64_t ne2, bool zero = true,
                          DType type = DType::F32) {
        Tensor * x = leaf(type, a, offset, ne0, ne1, ne2);
        set_input_param(ctx, x);
        args.push_back({x, g, goffset, true});
        if (zero) s.zeros.push_back({g, goffset, static_cast<size_t>(ne0 * ne1 * ne2) * sizeof(float)});
        return x;
    }
    // A layer boundary's buffer (In, Out) holds the hidden state in the boundary type, token t0 at
    // boundary_offset(t0); its gradient buffers hold f32:
    //   boundary_in     the state from token t0 on as a leaf, read as f32;
    //   boundary_param  the same as a hidden_param leaf (of the boundary type: read it through as_f32), its
    //                   gradient into g from token t0 on;
    //   boundary_out    a layer's output y as the boundary holds it: rounded to the type (to nearest even), a
    //                   rounding whose gradient is the identity.
    Tensor * boundary_in(Arg a, int64_t t0, int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
        return as_f32(leaf(boundary, a, boundary_offset(t0, ne0), ne0, ne1, ne2));
    }
    Tensor * boundary_param(Step & s, Arg a, int64_t t0, Arg g, int64_t ne0, int64_t ne1, int64_t ne2, bool zero = true) {
        return hidden_param(s, a, boundary_offset(t0, ne0), g, static_cast<size_t>(t0 * ne0) * sizeof(float), ne0, ne1, ne2, zero, boundary);
    }
    Tensor * boundary_out(Tensor * y) { return boundary == DType::F32 ? y : cast(ctx, y, boundary); }
    Tensor * as_f32(Tensor * x) { return x->type == DType::F32 ? x : cast(ctx, x, DType::F32); }
    size_t boundary_offset(int64_t token, int64_t n_embd) const { return static_cast<size_t>(token * n_embd) * dtype_type_size(boundary); }
    // The micro-batch's token positions as step s reads them (their values: upload_positions). Unpacked:
    // 0 .. T-1, shared by the sequences. Packed: the micro-batch's own positions and each token's first
    // visible key (the start of its example).
    TokenPositions positions(Step & s, const MicroBatchInfo & mb) {
        auto input = [&](int64_t n) {
            Tensor * t = ctx.new_tensor(DType::I32, n);
            t->flags |= kFlagInput;
            return t;
        };
        const TokenPositions tp = mb.packed ? TokenPositions(input(mb.tokens()), input(mb.tokens())) : TokenPositions(input(mb.seq_len));
        s.positions.push_back(tp);
        return tp;
    }
};

// A decoder layer's forward + backward graph kept between the sweeps of one micro-batch: the graph backward
// would rebuild from the layer's input, planned once into its own buffer. Its forward nodes run in the forward
// sweep (the layer output is copied out as the next layer's input), the others in the backward sweep, so the
// kept activations replace the recompute and the gradients are the recompute path's bits. Built and planned
// once per shape (ProgramKey) and replayed: each micro-batch only points its leafs at that micro-batch's
// buffers and binds the plan (no planning) in the layer's buffer.
struct Trainer::KeptLayer {
    Program p;
    Graph whole, forward, backward;
    // Memory: the forward nodes the backward reads stay in the layer's own buffer between the sweeps (kept, at
    // their offsets; kept_bytes in all); every other node (the forward's temporaries, the backward's) is planned
    // (scratch_plan: the kept ones placed) in the host buffer the other programs share, for each half as it runs.
    std::vector<std::pair<Tensor *, size_t>> kept;
    size_t kept_bytes = 0;
    AllocPlan scratch_plan;
    Tensor * y = nullptr;
    TokenPositions pos{nullptr};
    std::vector<int32_t> pos_values, first_values;  // what pos points at while the layer is kept
    size_t din_bytes = 0;
    KeptLayer(const Trainer & tr, int layer, const MicroBatchInfo & mb) : p(tr, layer, tr.host_memory(layer), true, mb) {}
};

// The values of positions leafs (Program::positions) for micro-batch mb: pos, and key starts when packed.
void position_values(const MicroBatchInfo & mb, std::vector<int32_t> & pos, std::vector<int32_t> & first);

inline size_t token_offset_bytes(int64_t token, int64_t n_embd) { return static_cast<size_t>(token * n_embd) * sizeof(float); }

} // namespace rp
