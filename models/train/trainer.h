// Finetuning on one device: the trainable tensors (LoRA factors, or fp32 masters of every float weight for a
// full finetune) and the per-layer training graphs (architecture.md §6). In three files by job:
//   trainer.cpp         the trainable tensors and masters, gradients, whole-model loss / logits, save;
//   layer_programs.cpp  the per-layer programs of the sequential view, built once per shape and replayed;
//   host_step.cpp       host training's micro-batch (accumulate()): the sweep and its kept layers.
//
// One micro-batch (accumulate()):
//   forward   embedding graph, then one graph per layer; only each layer's input (the checkpoint) is kept,
//             or, when they fit FinetuneConfig::activation_memory, each layer's forward + backward graph with
//             what its backward reads of its forward (run half now, half in the backward: no recompute);
//   tail      final norm + fused chunked LM head + cross-entropy + its backward, in one graph (never recomputed);
//   backward  per layer from last to first: recompute the layer graph from its checkpoint, seed it with the
//             gradient of the layer output, produce the gradient of the layer input and accumulate the
//             parameter gradients;
//   embedding backward (token_embd or its LoRA pair) last.
// A tied head is one parameter (token_embd) that gets two contributions (head and embedding), summed.
// Each graph holds one layer's activations: this is the unit RoundPipe distributes as a stage. The graphs are
// built once per shape and replayed with each call's memory (FinetuneConfig::replay_graphs), not rebuilt for
// every micro-batch.
//
// The same per-layer programs (forward / head / backward over the sequential view: layer 0 = the embedding,
// 1..n_layer = the decoder blocks, n_layer + 1 = final norm + LM head + loss) run here on host memory and, the
// Trainer being a TrainingProgram (roundpipe/program.h), on RoundPipe's devices: one code path, so the pipeline
// reproduces single-device training bit for bit.
//
// Gradient slots: a tied head (token_embd read by layer 0 and by the last layer) keeps one gradient slot per
// owning layer; each slot accumulates over micro-batches and calls in order, and collect_grads() sums them
// once per step (RoundPipe's grad hand-off does the same sum, roundpipe.md §5).
//
// The loss of a micro-batch is loss_scale * (sum of its unmasked token losses); pass loss_scale = 1 / (the
// unmasked tokens of the whole batch) so the split into micro-batches never changes the mean.
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/ops/grpo_math.h"
#include "ggml_rp/ops/preference_math.h"
#include "ggml_rp/roundpipe/program.h"
#include "models/arch/layer.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"

#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rp {

// The default LoRA targets (PEFT's usual set for Llama-style models).
std::vector<std::string> default_lora_targets();

struct FinetuneConfig {
    bool full = false;                              // full finetune instead of LoRA
    // Full finetune of these tensors only (GGUF names, e.g. "blk.3.ffn_norm.weight"); empty = every float
    // tensor. The others stay frozen in their dtype.
    std::vector<std::string> full_tensors;
    std::vector<std::string> lora_targets = default_lora_targets();  // short names: "attn_q", "ffn_up", ...
    // The longest sequence the run trains on: phi3's LongRoPE factors are the long ones beyond the model's original
    // context (Model::graph_weights); 0 = the short ones.
    int64_t context = 0;
    int64_t lora_rank = 8;
    float lora_alpha = 16.0f;
    // A LoRA adapter training starts from (ours, or any llama.cpp loads: f32, f16, bf16 or q8_0 factors, one rank):
    // its rank, alpha and base tensors replace lora_rank, lora_alpha and lora_targets (Trainer::config() holds
    // them, the targets as the adapted tensors' names), its factors the PEFT initialisation. "" = a new adapter.
    std::string start_adapter;
    float lora_dropout = 0.0f;                      // PEFT's lora_dropout, in [0, 1)
    uint64_t seed = 42;                             // the run's: LoRA init and dropout; a session's data order and split
    int64_t ce_chunk = 4096;                        // vocabulary rows per LM-head chunk
    // Host training (accumulate()): tokens per feed-forward and head graph (MicroBatchInfo::token_chunk;
    // 0 = every token in one graph). The RoundPipe runtime chooses its own (PipelineOptions::token_chunk).
    int64_t token_chunk = 0;
    // Host training (accumulate()): the decoder layers' activations are kept from the forward to the backward
    // (each layer's forward + backward graph is built once per micro-batch, its forward half run in the forward
    // sweep, its backward half in the backward sweep) when all of them take at most this many bytes; beyond it,
    // or with token_chunk, only each layer's input is kept and the layer is recomputed in the backward (a third
    // more forward work). The gradients are the same bits either way. 0: always recompute.
    size_t activation_memory = size_t(2) << 30;
    // What an accelerator may round the attention inputs to in training graphs (ops/attention.h): BF16 runs
    // the CUDA attention on tensor cores; F32 keeps it in f32. The CPU computes in f32 either way.
    DType attention_type = DType::BF16;
    // The hidden state at every layer boundary as the per-layer programs write it (TrainingProgram::boundary_bytes):
    // F32, or BF16 (every layer's output rounded to nearest even, the gradient passed through unchanged), which
    // halves the host's checkpoints and the link's activation bytes of RoundPipe runs. Every path rounds the same
    // outputs (host or devices, kept or recomputed layers, any plan or token chunk), so they keep one another's
    // bits; the results are not F32's. Gradients stay f32.
    DType boundary_type = DType::F32;
    // Mixture of experts: the coefficient of the Switch-style load-balancing loss added per MoE layer
    // (ops/moe_math.h; per graph, scaled like the main loss); 0 = none. Only shapes gradients: the reported
    // loss is the cross-entropy alone.
    float moe_aux_loss = 0.0f;
    // The per-layer training graphs are built and planned once per shape and replayed, each call pointing their
    // leafs at its own memory: the same bits as building them anew, which false does (tests compare the two).
    // Shape: the program and layer, sequence length, sequences, token chunk, packing; with the MoE
    // load-balancing loss also the loss scale of backward graphs. With LoRA dropout nothing is replayed (the
    // masks' keys, step and sequence offset, are op parameters of every micro-batch's own graphs).
    bool replay_graphs = true;
    // Preference training (DPO, IPO, SimPO, ORPO, KTO; ops/preference_loss.h) instead of the token cross-entropy:
    // micro-batches hold pairs (sequences 2k, 2k + 1: the chosen and the rejected answer; KTO: an example and its
    // KL sequence) and the head reads each sequence's values (MicroBatchInfo::sequence_values, [n_seq]
    // [kSequenceValues]) and reports each sequence's policy log-probability after the loss (head_results).
    // Unset: SFT.
    std::optional<PreferenceParams> preference;
    // GRPO (ops/grpo_loss.h) instead of the token cross-entropy: the head reads each token's values
    // (MicroBatchInfo::sequence_values, [n_seq][seq_len][kTokenValues]: its sequence's advantage, the rollout
    // policy's and the reference's log-probabilities, its weight, 0 on prompt and padding tokens) and reports
    // each token's log-probability after the loss (head_results). Unset: not GRPO (never with preference).
    std::optional<GrpoParams> grpo;
    // Preference training on packed sequences (models/data/dataset.h AnswerSlot): answer slots per sequence, each
    // with its values and its log-probability (the head's per-sequence values and results are per slot); 1: one
    // answer per sequence, unpacked.
    int32_t answer_slots = 1;
};

// Host training's kept-layer rule (FinetuneConfig::activation_memory), the one accumulate() follows and the
// memory plan (plan_run) counts: the decoder layers, in order, keep their activations while the bytes they keep
// fit the budget; the first that does not fit and every later one are recomputed. Never with token chunks.
class KeptLayerBudget {
public:
    explicit KeptLayerBudget(const FinetuneConfig & cfg)
        : budget_(cfg.activation_memory), open_(cfg.activation_memory > 0 && cfg.token_chunk == 0) {}
    explicit KeptLayerBudget(size_t budget) : budget_(budget) {}
    // Whether a next layer may still be kept.
    bool open() const { return open_; }
    // Whether the next layer, keeping `bytes`, is kept (once one is refused, every later one is).
    bool admit(size_t bytes) {
        if (!open_ || used_ + bytes > budget_) return open_ = false;
        used_ += bytes;
        return true;
    }
    size_t used() const { return used_; }

private:
    size_t budget_ = 0, used_ = 0;
    bool open_ = true;
};

// The decoder layers host training keeps under `budget` (KeptLayerBudget), whose kept bytes are given in order.
// *kept_bytes receives their sum.
size_t kept_activation_layers(const std::vector<size_t> & layer_graph_bytes, size_t budget, size_t * kept_bytes = nullptr);

// The base weight names a list of short target names selects ("attn_q" -> every "blk.N.attn_q.weight";
// "token_embd" / "output" -> that tensor). Throws rp::Error for a target that matches no tensor.
// On a mixture of experts, ffn_gate / ffn_up / ffn_down select the experts' tensors (ffn_*_exps); on phi3's fused
// projections attn_q / attn_k / attn_v select attn_qkv and ffn_gate / ffn_up the fused ffn_up (once).
std::vector<std::string> expand_lora_targets(const Model & model, const std::vector<std::string> & targets);

// What a Trainer allocates: everything (it trains), or only the tensors' shapes — for a memory plan
// (rp-finetune --plan, rp-simulate --max-seq): no master, gradient or adapter data, the model's weights never
// read; its programs may only be measured (TrainingProgram::program_footprint), never run.
enum class TrainerData { Allocate, ShapesOnly };

class Trainer final : public TrainingProgram {
public:
    // Throws rp::Error for rank < 1, an unknown target, or a LoRA target on the LM head (the fused head + CE
    // path trains the head only in a full finetune).
    Trainer(const Model & model, const FinetuneConfig & cfg, TrainerData data = TrainerData::Allocate);
    ~Trainer();

    struct Param {
        std::string name;   // GGUF name: "blk.0.attn_q.weight" (full) or "blk.0.attn_q.weight.lora_a"
        Tensor * t;         // f32 master, contiguous; t->grad its gradient buffer (same shape, f32)
    };
    const std::vector<Param> & params() const { return params_; }
    const FinetuneConfig & config() const { return cfg_; }
    const Model & model() const { return model_; }
    // The LoRA adapter being trained (nullptr for a full finetune).
    LoraAdapter * adapter() const { return adapter_.get(); }
    // What the training graphs read (the model's tensors, with the fp32 masters of a full finetune in their
    // place) and the LoRA factors being trained: an InferenceSession over them samples the weights as they are.
    const ModelWeights & graph_weights() const { return w_; }
    const LoraSet & lora() const { return lora_; }

    // Frees the graph buffers host training keeps from one step to the next (the next accumulate() allocates
    // them again): before writing a checkpoint or the result, whose peak they would add to.
    void free_graph_memory();
    // Zeroes every gradient and gradient slot (start of a step).
    void zero_grads();
    // Folds the per-owner slots of tied tensors into params()' grads: call once per step, after the last
    // accumulate() and before reading the gradients.
    void collect_grads();

    // Forward + backward of one micro-batch of n_seq sequences of seq_len tokens (ids and labels laid out
    // [n_seq][seq_len], label -1 = masked). Gradients are ADDED to each param's grad. Returns the loss
    // (loss_scale * sum of the unmasked token losses of this micro-batch).
    // step and seq_offset (the index of the first of these sequences in the step's batch) key the dropout masks.
    // positions: packed sequences ([n_seq][seq_len], restarting at 0 at each example: MicroBatchInfo), or
    // nullptr (every sequence one example, positions 0..seq_len-1).
    double accumulate(const int32_t * ids, const int32_t * labels, int64_t seq_len, int64_t n_seq, float loss_scale,
                      int n_threads = 0, int64_t step = 0, int64_t seq_offset = 0, const int32_t * positions = nullptr);

    // The same for a micro-batch described by mb (its sequence_values for a preference objective), writing
    // head_results(mb) floats to results (the loss, then each sequence's log-probability; nullptr: not kept).
    double accumulate(const int32_t * ids, const int32_t * labels, const MicroBatchInfo & mb, int n_threads, float * results = nullptr);

    // Forward only, the current weights: the summed log-probability of each sequence's labelled tokens
    // (f32 [n_seq]; the reference pass of preference training, and its evaluation). Packed preference data
    // (FinetuneConfig::answer_slots > 1, positions given): of each answer slot, f32 [n_seq * answer_slots].
    std::vector<float> sequence_logps(const int32_t * ids, const int32_t * labels, int64_t seq_len, int64_t n_seq, int n_threads = 0,
                                      const int32_t * positions = nullptr);

    // Forward only, the current weights: each token's log-probability of its label (f32 [n_seq * seq_len], 0 where
    // the label is masked): GRPO's rollout-policy and reference passes. reference: the base model's instead (without
    // the adapter; a full finetune's: the model file's weights).
    std::vector<float> token_logps(const int32_t * ids, const int32_t * labels, int64_t seq_len, int64_t n_seq, int n_threads = 0,
                                   const int32_t * positions = nullptr, bool reference = false);

    // Forward only: loss_scale * sum of the unmasked token losses.
    double loss(const int32_t * ids, const int32_t * labels, int64_t seq_len, int64_t n_seq, float loss_scale,
                int n_threads = 0, const int32_t * positions = nullptr);

    // Logits f32 [n_vocab][T] of one sequence with the current weights (tests, evaluation).
    // positions: a packed sequence's (restarting at each example), or nullptr.
    std::vector<float> logits(const int32_t * ids, int64_t seq_len, int n_threads = 0, const int32_t * positions = nullptr);

    // Writes the result: the adapter (LoRA), or the base model with its trained tensors in their original
    // float dtype (full). Temp file + rename.
    void save(const std::string & path) const;

    // Peak graph buffer bytes of the programs run so far (the largest per-layer graph, plus the kept layers'
    // activations alive beside it: FinetuneConfig::activation_memory).
    size_t peak_graph_bytes() const { return peak_graph_bytes_.load(); }
    // Host training's kept decoder layer (FinetuneConfig::activation_memory): the bytes it keeps between the
    // sweeps (the forward tensors its backward reads) and the bytes of its other nodes, planned in the buffer
    // the host's programs share (each half while it runs). For memory plans (plan_run).
    struct KeptBytes {
        size_t kept = 0;
        size_t scratch = 0;
    };
    KeptBytes kept_layer_bytes(int layer, const MicroBatchInfo & mb);
    // The per-layer programs built and kept for replay (FinetuneConfig::replay_graphs): one per shape and
    // layer program, more only while devices ran the same one at once.
    size_t cached_programs() const;

    // ---- the sequential view and its per-layer programs: the TrainingProgram (roundpipe/program.h documents
    // the contract) that RoundPipe runs on its devices and accumulate() on the host ----
    struct SeqTensor {
        Tensor * t;      // what the graphs read: a model weight (frozen) or an fp32 master / LoRA factor
        int param;       // index into params(), or -1
    };
    const std::vector<SeqTensor> & seq_tensors(int layer) const { return seq_[static_cast<size_t>(layer)]; }
    int num_layers() const override { return static_cast<int>(seq_.size()); }
    const std::vector<TensorInfo> & layer_tensors(int layer) const override { return layer_infos_[static_cast<size_t>(layer)]; }
    // params() as the runtime sees them: the masters and their gradients by pointer, in params()' order.
    const std::vector<ParamInfo> & param_infos() const override { return param_infos_; }
    std::string layer_name(int layer) const override;
    size_t hidden_bytes(const MicroBatchInfo & mb) const override;
    size_t boundary_bytes(const MicroBatchInfo & mb) const override;
    // Bytes of a layer input host training (accumulate) keeps: boundary_bytes, or hidden_bytes when a token-chunked
    // forward (mb.token_chunk) writes its f32 attention half there first. The plan (run_plan) counts the same.
    size_t host_input_bytes(const MicroBatchInfo & mb) const {
        return mb.token_chunk > 0 && mb.token_chunk < mb.tokens() ? hidden_bytes(mb) : boundary_bytes(mb);
    }
    void forward(int layer, const LayerMemory & w, const void * in, void * out, const MicroBatchInfo & mb,
                 ProgramContext & pc) override;
    void head(const LayerMemory & w, const void * in, const int32_t * labels, float * loss, void * din,
              const MicroBatchInfo & mb, ProgramContext & pc) override;
    void head_forward(const LayerMemory & w, const void * in, const int32_t * labels, float * results, const MicroBatchInfo & mb,
                      ProgramContext & pc) override;
    void backward(int layer, const LayerMemory & w, const void * in, const void * dout, void * din,
                  const MicroBatchInfo & mb, ProgramContext & pc) override;
    size_t program_footprint(ProgramKind kind, int layer, const MicroBatchInfo & mb, const GraphRunner & rules) override;
    // Layer `layer`'s tensors where the host holds them, for its programs run on the host: the tensors' own data,
    // the gradients into their slots (what accumulate() passes).
    LayerMemory host_memory(int layer) const;
    // The model FLOPs (ggml_rp/ops/flops.h) of one training micro-batch of this shape: every layer's forward
    // and backward once and the head's, a recompute not counted (nor the token chunk's: it only recomputes).
    // Built and measured, not run. For MFU: divided by a step's time and the machine's peak.
    double model_flops(const MicroBatchInfo & mb);
    // Preference training: the loss and each sequence's policy log-probability; [reference, tokens, NLL weight,
    // kind] per sequence in (ops/preference_math.h SequenceValue).
    // (Packed: per answer slot, FinetuneConfig::answer_slots per sequence.) GRPO: the loss and each token's
    // log-probability; kTokenValues per token in (ops/grpo_math.h TokenValue).
    size_t head_results(const MicroBatchInfo & mb) const override {
        return cfg_.preference ? 1 + static_cast<size_t>(mb.n_seq * cfg_.answer_slots) : cfg_.grpo ? 1 + static_cast<size_t>(mb.tokens()) : 1;
    }
    size_t sequence_values(const MicroBatchInfo & mb) const override {
        return cfg_.preference ? static_cast<size_t>(kSequenceValues * cfg_.answer_slots)
               : cfg_.grpo     ? static_cast<size_t>(kTokenValues * mb.seq_len)
                               : 0;
    }
    // The hyper-parameters a backward graph of micro-batch mb is built with: the model's, plus the MoE
    // load-balancing scale (cfg.moe_aux_loss x n_expert x mb.loss_scale).
    HParams backward_hparams(const MicroBatchInfo & mb) const;

private:
    struct Bound;     // a layer's tensors rebound to LayerMemory inside one program's context
    struct Program;   // a per-layer program's graphs, built once per shape and replayed
    enum class Arg : uint8_t;  // the buffers a program call passes (in, out, din, dout, labels, loss)
    struct CallArgs;
    struct ProgramKey {
        int kind = 0, layer = 0;
        int64_t seq_len = 0, n_seq = 0, token_chunk = 0;
        bool packed = false, vocab_on_host = false, vocab_pass_once = false;
        int64_t step = 0, seq_offset = 0;
        uint32_t scale_bits = 0;
        bool operator<(const ProgramKey & o) const;
    };
    Bound bind(Context & ctx, int layer, const LayerMemory & mem, bool with_grads, const MicroBatchInfo & mb) const;
    ProgramKey program_key(ProgramKind kind, int layer, const MicroBatchInfo & mb, bool kept) const;
    bool replays() const;  // programs are kept for replay (FinetuneConfig::replay_graphs)
    // Kept programs of each pool at most (cleared when full: shapes that keep changing, as the loss scales of a
    // MoE load-balancing loss over masked data, must not grow them without end).
    static constexpr size_t kMaxCachedPrograms = 512;
    std::unique_ptr<Program> take_program(const ProgramKey & key);
    void give_back(const ProgramKey & key, std::unique_ptr<Program> p);
    // Points the program's layer tensors at mem and its argument leafs at a's buffers.
    void rebind(Program & p, const LayerMemory & mem, const CallArgs & a);
    // Runs the program's graphs in order on pc's runner (or the host's) with this call's memory.
    void run_program(Program & p, const LayerMemory & mem, const CallArgs & a, const MicroBatchInfo & mb, ProgramContext & pc);
    // Runs the program of (kind, layer) for mb: a replay of one built for its shape, or build(program) first.
    template <class Build>
    void call_program(ProgramKind kind, int layer, const LayerMemory & mem, bool grads, const CallArgs & a, const MicroBatchInfo & mb,
                      ProgramContext & pc, Build build);
    void attention_half_into(Program & p, int layer, Arg dst, const MicroBatchInfo & mb);
    struct KeptLayer;  // a decoder layer's forward + backward graph with its activations, between the sweeps
    std::unique_ptr<KeptLayer> keep_layer(int layer, const void * in, const void * dout, void * din, const MicroBatchInfo & mb);
    void release_kept(int layer, const MicroBatchInfo & mb, std::unique_ptr<KeptLayer> k);
    static void split_kept_memory(KeptLayer & k);
    // Points the kept nodes into the layer's own buffer and the others into the shared host buffer.
    void bind_kept(int layer, KeptLayer & k);
    Tensor * build_loss(Context & ctx, const ModelWeights & w, Tensor * x, Tensor * labels, float loss_scale) const;
    // Whether program p reads layer `layer`'s streamable tensor from the host (mb.vocab_on_host): the head's
    // output matrix (head_ranges) or the embedding (the gathered rows of layer 0's forward).
    bool vocab_on_host(const Program & p, const MicroBatchInfo & mb, const Tensor * t) const;
    // A head on the host (vocab_on_host): the steps that fold its row ranges into the state of token ranges, held
    // for the program, before the steps that finish the loss from it (head_loss). head_ranges: tokens [t0, t0 + n)
    // alone, its state held alone (nullptr: the head is not on the host); head_ranges_once: every token range of
    // `ranges` (the micro-batch's, as token_ranges gives them) in each row range's graph, all their states held
    // (MicroBatchInfo::vocab_pass_once; empty: not on the host). fold_head: the steps, one graph per row range.
    using TokenRanges = std::vector<std::pair<int64_t, int64_t>>;
    Tensor * head_ranges(Program & p, const MicroBatchInfo & mb, const GraphRunner * runner, int64_t t0, int64_t n, bool grad);
    std::vector<Tensor *> head_ranges_once(Program & p, const MicroBatchInfo & mb, const GraphRunner * runner, const TokenRanges & ranges,
                                           bool grad);
    void fold_head(Program & p, const GraphRunner * runner, const TokenRanges & ranges, const std::vector<Tensor *> & states, bool grad);
    // The head's loss of x's tokens (per_token: each token's NLL), from the ranges' state when streamed.
    Tensor * head_loss(Program & p, Tensor * x, Tensor * labels, Tensor * state, float loss_scale, bool per_token, bool grad) const;
    // The head program of a preference objective (one graph: a sequence's loss needs all its tokens).
    void build_preference_head(Program & p, const MicroBatchInfo & mb);
    // A head whose loss reads values (MicroBatchInfo::sequence_values: n_values of values_per floats) and which
    // reports what the loss is computed from after it: reported(step, per-token NLL) makes that, loss_of(it,
    // values) the loss; one graph with its backward (preference and GRPO heads).
    template <class Reported, class LossOf>
    void build_valued_head(Program & p, const MicroBatchInfo & mb, int64_t values_per, int64_t n_values, Reported reported, LossOf loss_of);
    // The head program of GRPO (one graph): per-token NLL -> log-probabilities -> grpo_loss, and back.
    void build_grpo_head(Program & p, const MicroBatchInfo & mb);
    // Each answer's log-probability from the head's per-token NLL: per sequence, or per answer slot (packed;
    // slot_input is then set to the input its step uploads each token's slot into: Program::Step::answer_slots).
    Tensor * build_answer_logps(Program & p, Tensor *& slot_input, const MicroBatchInfo & mb, Tensor * token_nll) const;
    // Loads cfg_.start_adapter and makes its rank, alpha and adapted tensors cfg_'s.
    std::unique_ptr<LoraAdapter> adopt_start_adapter();
    // peak_graph_bytes() = max over time of (a graph's bytes + the kept layers' buffers alive with it).
    void note_graph_bytes(size_t graph);

    const Model & model_;
    FinetuneConfig cfg_;
    Context ctx_;                          // masters and gradient buffers
    std::unique_ptr<LoraAdapter> adapter_;
    LoraSet lora_;
    ModelWeights w_;                       // what the graphs read: the model's leafs or the fp32 masters
    std::vector<Param> params_;
    std::vector<std::vector<SeqTensor>> seq_;  // per sequential layer
    std::vector<std::vector<TensorInfo>> layer_infos_;  // seq_ as the runtime sees it
    std::vector<ParamInfo> param_infos_;
    Tensor * head_slot_ = nullptr;              // tied head: the head's own gradient slot of token_embd
    std::atomic<size_t> peak_graph_bytes_{0};
    std::atomic<size_t> kept_live_{0};  // accumulate(): bytes the kept layers now hold
    // Host training's graph memory, reused across graphs and steps (one thread: accumulate()'s): the
    // transient programs' buffer, and each kept layer's own.
    CpuBackend host_graphs_;
    std::vector<std::unique_ptr<CpuBackend>> kept_graphs_;
    // accumulate()'s layer inputs (the checkpoints) and the two output-gradient buffers of its backward sweep,
    // kept from step to step so that a step maps no fresh pages for them (each zeroed when a step takes it).
    std::vector<std::vector<float>> step_inputs_;
    std::vector<float> step_grads_[2];
    CpuBackend & kept_backend(int layer);
    // The programs built so far, idle between calls (a call takes one out, so devices running the same layer's
    // program at once each get their own); host training's kept layers apart (accumulate()'s thread only).
    mutable std::mutex programs_m_;
    std::multimap<ProgramKey, std::unique_ptr<Program>> programs_;
    std::multimap<ProgramKey, std::unique_ptr<KeptLayer>> kept_cache_;
};

} // namespace rp
