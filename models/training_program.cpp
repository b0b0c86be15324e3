#include "models/training_program.h"

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

} // namespace rp
