// The finetune Trainer seen through the RoundPipe runtime's TrainingProgram interface (roundpipe/program.h):
// the sequential view (embedding, decoder blocks, head), what each layer uploads, the trainable parameters
// (fp32 masters and gradients owned by the Trainer) and the per-layer programs, which are the Trainer's own
// (seq_forward / seq_head / seq_backward), so a pipelined run and a single-device run share every kernel call.
#pragma once

#include "ggml_rp/roundpipe/program.h"
#include "models/train/trainer.h"

#include <string>
#include <vector>

namespace rp {

class ModelProgram final : public TrainingProgram {
public:
    explicit ModelProgram(const Trainer & trainer);

    int num_layers() const override { return trainer_.num_seq_layers(); }
    const std::vector<TensorInfo> & layer_tensors(int layer) const override { return layers_[static_cast<size_t>(layer)]; }
    const std::vector<ParamInfo> & params() const override { return params_; }
    std::string layer_name(int layer) const override { return trainer_.seq_layer_name(layer); }
    size_t hidden_bytes(const MicroBatchInfo & mb) const override { return trainer_.hidden_bytes(mb); }

    void forward(int layer, const LayerMemory & w, const void * in, void * out, const MicroBatchInfo & mb,
                 ProgramContext & pc) override {
        trainer_.seq_forward(layer, w, in, out, mb, pc);
    }
    void head(const LayerMemory & w, const void * in, const int32_t * labels, float * loss, void * din,
              const MicroBatchInfo & mb, ProgramContext & pc) override {
        trainer_.seq_head(w, in, labels, loss, din, mb, pc);
    }
    void backward(int layer, const LayerMemory & w, const void * in, const void * dout, void * din,
                  const MicroBatchInfo & mb, ProgramContext & pc) override {
        trainer_.seq_backward(layer, w, in, dout, din, mb, pc);
    }
    size_t program_footprint(ProgramKind kind, int layer, const MicroBatchInfo & mb, const GraphRunner & rules) override;

private:
    const Trainer & trainer_;
    std::vector<std::vector<TensorInfo>> layers_;
    std::vector<ParamInfo> params_;
};

} // namespace rp
