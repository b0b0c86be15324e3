#include "models/train/training_program.h"

#include "ggml_rp/runtime/graph_runner.h"

namespace rp {

ModelProgram::ModelProgram(const Trainer & trainer) : trainer_(trainer) {
    for (const Trainer::Param & p : trainer.params())
        params_.push_back({p.name, p.t->data_as<float>(), p.t->grad->data_as<float>(), static_cast<size_t>(p.t->nelements())});
    layers_.resize(static_cast<size_t>(trainer.num_seq_layers()));
    for (int l = 0; l < trainer.num_seq_layers(); ++l)
        for (const Trainer::SeqTensor & st : trainer.seq_tensors(l)) {
            TensorInfo ti;
            ti.name = st.t->name;
            ti.param = st.param;
            ti.bytes = st.param >= 0 ? static_cast<size_t>(st.t->nelements()) * sizeof(float) : st.t->nbytes();
            ti.host = st.param >= 0 ? nullptr : st.t->data;
            layers_[static_cast<size_t>(l)].push_back(ti);
        }
}

size_t ModelProgram::program_footprint(ProgramKind kind, int layer, const MicroBatchInfo & mb, const GraphRunner & rules) {
    // The program itself, over memory that is never touched: its graphs are built and measured, not run.
    FootprintRunner fr(rules);
    ProgramContext pc;
    pc.runner = &fr;
    LayerMemory mem;
    mem.data.assign(layers_[static_cast<size_t>(layer)].size(), nullptr);
    mem.grad.assign(layers_[static_cast<size_t>(layer)].size(), nullptr);
    switch (kind) {
    case ProgramKind::Forward: trainer_.seq_forward(layer, mem, nullptr, nullptr, mb, pc); break;
    case ProgramKind::Head: trainer_.seq_head(mem, nullptr, nullptr, nullptr, nullptr, mb, pc); break;
    case ProgramKind::Backward: trainer_.seq_backward(layer, mem, nullptr, nullptr, nullptr, mb, pc); break;
    }
    return fr.peak();
}

} // namespace rp
