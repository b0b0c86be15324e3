// What the RoundPipe runtime needs from a model: its sequential view of layers, the tensors each layer reads,
// the trainable parameters, and the per-layer programs that run on a device (roundpipe.md §2, §14.2).
//
// The runtime knows nothing about transformers. A layer is a unit of weights and compute; layer 0 consumes
// token ids, layer L-1 ends in the loss, every boundary in between carries one hidden-state tensor per
// micro-batch (inter-stage state = hidden states only, §7). The runtime uploads a layer's tensors into device
// memory and calls the layer's programs with device pointers inside a compute-stream launch (device.h); the
// programs take their scratch memory from the device's arena, so a device's high-water mark covers them.
//
// Recompute reproduces the forward exactly because a program is a pure function of (weights, input,
// MicroBatchInfo): any randomness (LoRA dropout) is drawn from a counter-based generator keyed by the step,
// the layer and the sequence index, never from generator state (§4).
#pragma once

#include "ggml_rp/runtime/device.h"
#include "ggml_rp/roundpipe/footprint_rules.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rp {

// One micro-batch as its programs see it.
struct MicroBatchInfo {
    int64_t seq_len = 0;
    int64_t n_seq = 0;
    int64_t seq_offset = 0;   // index of its first sequence in the step's batch (keys the dropout masks)
    int64_t step = 0;         // optimizer step (keys the dropout masks)
    float loss_scale = 1.0f;  // the loss is loss_scale * sum of the unmasked token losses
    // > 0 and < tokens(): the feed-forward halves and the head run over ranges of this many tokens, one graph
    // each, so no [tokens x n_ff] or [tokens x vocab] tensor is ever whole (its backward recomputes the
    // attention half once more); 0: one graph per program. Chosen by the call planner (call_planner.h).
    int64_t token_chunk = 0;
    // Packed sequences (several examples per sequence, each attending only to itself): the RoPE position of
    // every token, [n_seq][seq_len], restarting at 0 at each example, so token t's example starts at
    // t - positions[t]. The programs then build per-token positions and attention key starts (the same
    // shapes whether or not they compute: a plan sets `packed` without data). Not packed: positions 0..T-1.
    bool packed = false;
    const int32_t * positions = nullptr;  // host memory outliving the programs (RoundPipe: the call's copy)
    // A sequence-level objective's inputs for the head program, opaque to the runtime: floats per sequence
    // ([n_seq][TrainingProgram::sequence_values(mb)]), host memory outliving the call; nullptr for token losses.
    const float * sequence_values = nullptr;
    // The programs' mode: training (LoRA dropout and the like active), or evaluation (Pipeline::forward).
    bool training = true;
    // The vocabulary matrices (TensorInfo::vocab_rows) stay in host memory: the programs upload what each graph
    // reads of them (the LM head range by range, the embedding's rows of the micro-batch's tokens), so no job
    // holds them whole. Chosen by the call planner when nothing else fits (call_planner.h).
    bool vocab_on_host = false;
    // With vocab_on_host and token ranges (token_chunk): the head folds each of its row ranges into the state of
    // every token range before the next (each row crosses the link once per micro-batch), holding all the tokens'
    // state; else one token range after the other (the head crosses once per token range, the state of one range
    // held). The same bits either way.
    bool vocab_pass_once = false;
    // The token ids in host memory ([n_seq][seq_len], layer 0's input; RoundPipe: the call's copy): the rows an
    // embedding on the host gathers; nullptr lets a program that only measures build the shapes.
    const int32_t * token_ids = nullptr;
    int64_t tokens() const { return seq_len * n_seq; }
};

// Where a program runs: the runner of the device it was launched on (Device::runner(); its graphs take their
// memory from that device), or nullptr for plain host memory (the program then uses a CPU runner of its own);
// and the threads the CPU kernels may use.
struct ProgramContext {
    GraphRunner * runner = nullptr;
    int n_threads = 1;
};

// A layer's tensors bound to memory, in the order of TrainingProgram::layer_tensors: data for every tensor,
// grad (f32, accumulated into) for the trainable ones (nullptr otherwise, and in forward programs). A vocabulary
// matrix left on the host (MicroBatchInfo::vocab_on_host) has its host bytes as data.
struct LayerMemory {
    std::vector<void *> data;
    std::vector<float *> grad;
};

// The kinds of program a layer has: forward, the head (forward + loss + backward), backward (recompute +
// backward); and the head's forward alone (HeadForward: evaluation, a reference pass; no gradient).
enum class ProgramKind { Forward, Head, Backward, HeadForward };

class TrainingProgram {
public:
    struct TensorInfo {
        std::string name;          // e.g. "blk.3.attn_q.weight" or "blk.3.attn_q.weight.lora_a"
        size_t bytes = 0;          // bytes on the device (the working copy: f32 for trainable tensors)
        int param = -1;            // index into param_infos(), or -1 for a frozen tensor
        const void * host = nullptr;  // frozen tensors: the host bytes to upload (trainable: the host store's copy)
        // > 0: a frozen matrix of this many rows (contiguous, bytes / vocab_rows each) that may stay on the host
        // (MicroBatchInfo::vocab_on_host): its LayerMemory data is then `host`, which the programs upload from
        int64_t vocab_rows = 0;
    };
    struct ParamInfo {
        std::string name;
        float * master = nullptr;  // fp32 master weights (host)
        float * grad = nullptr;    // fp32 gradient the optimizer reads (host)
        size_t n = 0;              // elements
    };

    virtual ~TrainingProgram() = default;

    // L: layer 0 takes token ids, layer L-1 ends in the loss (L >= 2).
    virtual int num_layers() const = 0;
    virtual const std::vector<TensorInfo> & layer_tensors(int layer) const = 0;
    virtual const std::vector<ParamInfo> & param_infos() const = 0;
    virtual std::string layer_name(int layer) const = 0;

    // Bytes of the hidden state at a layer boundary (f32: the device buffers that hold it, and its gradient),
    // and of the token ids / labels, for one micro-batch.
    virtual size_t hidden_bytes(const MicroBatchInfo & mb) const = 0;
    // Bytes of the hidden state as the programs write and read it at a boundary: what the host keeps (forward
    // outputs, backward checkpoints) and the link moves. hidden_bytes, or fewer when the programs store the state
    // narrower (bf16: FinetuneConfig::boundary_type), at the start of a hidden_bytes buffer; gradients stay f32.
    virtual size_t boundary_bytes(const MicroBatchInfo & mb) const { return hidden_bytes(mb); }
    size_t token_bytes(const MicroBatchInfo & mb) const { return static_cast<size_t>(mb.tokens()) * sizeof(int32_t); }

    // Forward of layer l < L-1 (no gradient state): in = ids for l == 0, else the hidden state; out = hidden.
    virtual void forward(int layer, const LayerMemory & w, const void * in, void * out, const MicroBatchInfo & mb,
                         ProgramContext & pc) = 0;
    // Layer L-1: forward, loss, backward in one program (never recomputed). Writes the loss to *loss (device
    // memory), the gradient of its input to din (overwritten) and ADDS the parameter gradients into w.grad.
    // A sequence-level objective writes head_results(mb) floats from `loss` on: the loss, then what it reports
    // per sequence.
    virtual void head(const LayerMemory & w, const void * in, const int32_t * labels, float * loss, void * din,
                      const MicroBatchInfo & mb, ProgramContext & pc) = 0;
    // Layer L-1 without gradients (Pipeline::forward): writes head_results(mb) floats to results (device
    // memory): what the head reports per sequence after the forward loss (a sequence-level objective, whose
    // loss needs values the caller may not have yet, writes 0 there).
    virtual void head_forward(const LayerMemory & w, const void * in, const int32_t * labels, float * results, const MicroBatchInfo & mb,
                              ProgramContext & pc) = 0;
    // Recompute + backward of layer l < L-1 from its input: ADDS parameter gradients into w.grad; writes the
    // gradient of the input to din (overwritten; not written for l == 0, whose input is token ids).
    virtual void backward(int layer, const LayerMemory & w, const void * in, const void * dout, void * din,
                          const MicroBatchInfo & mb, ProgramContext & pc) = 0;

    // Floats the head writes from its `loss` pointer (1: the loss), and floats per sequence it reads from
    // MicroBatchInfo::sequence_values (0: none; a per-token objective's depend on the sequence length).
    virtual size_t head_results(const MicroBatchInfo &) const { return 1; }
    virtual size_t sequence_values(const MicroBatchInfo &) const { return 0; }

    // The device memory (graphs and uploads: the device's graph region) the program of (kind, layer) takes for
    // micro-batch mb when its graphs run under `rules` (a device's runner, or footprint_rules(backend)); found
    // without running anything (runtime/graph_runner.h FootprintRunner), never reading weights. Head: layer L-1.
    virtual size_t program_footprint(ProgramKind kind, int layer, const MicroBatchInfo & mb, const GraphRunner & rules) = 0;
};

} // namespace rp
