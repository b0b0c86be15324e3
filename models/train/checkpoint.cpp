#include "models/train/checkpoint.h"

#include "base/error.h"
#include "gguf/gguf.h"

#include <cstring>

namespace rp {

namespace {

constexpr const char * kType = "rp.finetune.checkpoint";

uint64_t fnv(uint64_t h, const void * p, size_t n) {
    const auto * b = static_cast<const uint8_t *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

} // namespace

uint64_t base_fingerprint(const Model & model) {
    uint64_t h = 1469598103934665603ull;
    for (const gguf::TensorInfo & t : model.file().tensors()) {
        h = fnv(h, t.name.data(), t.name.size() + 0);
        const uint32_t type = static_cast<uint32_t>(t.type);
        h = fnv(h, &type, sizeof type);
        h = fnv(h, t.ne, sizeof t.ne);
    }
    return h;
}

void save_checkpoint(const std::string & path, const Trainer & tr, const Optimizer & opt, const CheckpointState & st) {
    const FinetuneConfig & cfg = tr.config();
    gguf::Writer w;
    w.set_string("general.type", kType);
    w.set_string("general.architecture", tr.model().hparams().arch->name);
    w.set_u64("rp.ckpt.base_fingerprint", base_fingerprint(tr.model()));
    w.set_bool("rp.ckpt.full", cfg.full);
    w.set_u32("rp.ckpt.lora_rank", static_cast<uint32_t>(cfg.lora_rank));
    w.set_f32("rp.ckpt.lora_alpha", cfg.lora_alpha);
    w.set_string_array("rp.ckpt.lora_targets", cfg.lora_targets);
    w.set_u64("rp.ckpt.step", static_cast<uint64_t>(st.step));
    w.set_u64("rp.ckpt.opt_step", static_cast<uint64_t>(opt.step()));
    w.set_u64("rp.ckpt.data_seed", st.data.seed);
    w.set_u64("rp.ckpt.data_fingerprint", st.data.fingerprint);
    w.set_u64("rp.ckpt.data_consumed", st.data.consumed);
    if (!st.curve.train_loss.empty()) w.set_f32_array("rp.ckpt.train_loss", st.curve.train_loss);
    if (!st.curve.eval_step.empty()) {
        w.set_i32_array("rp.ckpt.eval_step", st.curve.eval_step);
        w.set_f32_array("rp.ckpt.eval_loss", st.curve.eval_loss);
    }
    uint64_t bits = 0;
    std::memcpy(&bits, &st.health.last_norm, sizeof bits);
    w.set_u64("rp.ckpt.last_norm_bits", bits);
    w.set_i64("rp.ckpt.last_norm_step", st.health.last_norm_step);
    w.set_string("rp.ckpt.last_skip", st.health.last_skip);
    w.set_u64("rp.ckpt.bad_run", static_cast<uint64_t>(st.health.bad_run));
    w.set_u32("rp.ckpt.grad_groups", static_cast<uint32_t>(st.grad_groups));
    if (!st.run_config.empty()) w.set_string("rp.ckpt.run_config", st.run_config);
    if (!st.reference_logps.empty()) w.set_f32_array("rp.ckpt.reference_logps", st.reference_logps);
    if (!st.curve.reward.empty()) w.set_f32_array("rp.ckpt.reward", st.curve.reward);
    if (!st.objective.ints.empty()) w.set_i32_array("rp.ckpt.objective.ints", st.objective.ints);
    if (!st.objective.floats.empty()) w.set_f32_array("rp.ckpt.objective.floats", st.objective.floats);
    if (!st.objective.text.empty()) w.set_string("rp.ckpt.objective.text", st.objective.text);
    if (!st.curve.reward_chosen.empty()) {
        w.set_f32_array("rp.ckpt.reward_chosen", st.curve.reward_chosen);
        w.set_f32_array("rp.ckpt.reward_rejected", st.curve.reward_rejected);
    }
    std::vector<const float *> working = st.working_at;
    if (working.empty())
        for (const std::vector<float> & v : st.working) working.push_back(v.data());
    if (!working.empty() && working.size() != tr.params().size()) throw Error(path + ": working weights for the wrong number of parameters");
    for (size_t i = 0; i < tr.params().size(); ++i) {
        const Trainer::Param & p = tr.params()[i];
        const int64_t ne[4] = {p.t->ne[0], p.t->ne[1], p.t->ne[2], p.t->ne[3]};
        const uint32_t dims = p.t->ne[3] != 1 ? 4 : p.t->ne[2] != 1 ? 3 : 2;  // expert tensors are 3-D
        w.add_tensor(p.name, DType::F32, dims, ne, p.t->data);
        if (!working.empty()) w.add_tensor(p.name + ".working", DType::F32, dims, ne, working[i]);
    }
    const std::vector<StateArray> arrays = opt.state_arrays();
    for (const StateArray & a : arrays) {
        const int64_t ne[1] = {static_cast<int64_t>(a.size())};
        w.add_tensor(a.name, a.bf16.empty() ? DType::F32 : DType::BF16, 1, ne, a.bytes());
    }
    w.write(path);
}

CheckpointState load_checkpoint(const std::string & path, Trainer & tr, Optimizer & opt) {
    auto f = gguf::Reader::open(path);
    auto fail = [&](const std::string & msg) { throw Error(path + ": " + msg); };
    const std::string type = f->get_string_or("general.type", "");
    if (type != kType) fail("general.type is '" + type + "', expected '" + kType + "' (not a finetune checkpoint)");
    if (f->get_u64("rp.ckpt.base_fingerprint") != base_fingerprint(tr.model()))
        fail("this checkpoint was made for another base model than " + tr.model().path() +
             " (tensor names, types or shapes differ)");
    const FinetuneConfig & cfg = tr.config();
    if (f->get_bool("rp.ckpt.full") != cfg.full)
        fail(std::string("checkpoint of a ") + (cfg.full ? "LoRA" : "full") + " finetune, but this run is " +
             (cfg.full ? "full" : "LoRA"));
    if (!cfg.full) {
        if (f->get_u32("rp.ckpt.lora_rank") != cfg.lora_rank)
            fail("lora_rank " + std::to_string(cfg.lora_rank) + " differs from the checkpoint's " +
                 std::to_string(f->get_u32("rp.ckpt.lora_rank")));
        if (f->get_f32("rp.ckpt.lora_alpha") != cfg.lora_alpha) fail("lora_alpha differs from the checkpoint's");
        if (f->get_string_array("rp.ckpt.lora_targets") != cfg.lora_targets) fail("lora_targets differ from the checkpoint's");
    }
    // Trainable tensors.
    for (const Trainer::Param & p : tr.params()) {
        const gguf::TensorInfo * ti = f->find_tensor(p.name);
        if (!ti) fail("missing tensor '" + p.name + "'");
        if (ti->type != DType::F32 || ti->nelements() != p.t->nelements()) fail("tensor '" + p.name + "' has the wrong type or size");
        std::memcpy(p.t->data, f->tensor_data(*ti), static_cast<size_t>(ti->nelements()) * sizeof(float));
    }
    // Async working weights (all of them or none).
    CheckpointState st;
    for (const Trainer::Param & p : tr.params()) {
        const gguf::TensorInfo * ti = f->find_tensor(p.name + ".working");
        if (!ti) {
            if (!st.working.empty()) fail("missing tensor '" + p.name + ".working'");
            continue;
        }
        if (st.working.size() != static_cast<size_t>(&p - tr.params().data())) fail("missing working weights before '" + p.name + "'");
        if (ti->type != DType::F32 || ti->nelements() != p.t->nelements()) fail("tensor '" + ti->name + "' has the wrong type or size");
        const float * d = reinterpret_cast<const float *>(f->tensor_data(*ti));
        st.working.emplace_back(d, d + ti->nelements());
    }
    // Optimizer state: every tensor that is not a parameter or its working copy.
    std::vector<StateArray> arrays;
    for (const gguf::TensorInfo & ti : f->tensors()) {
        bool is_param = false;
        for (const Trainer::Param & p : tr.params()) is_param |= p.name == ti.name || p.name + ".working" == ti.name;
        if (is_param) continue;
        if (ti.type != DType::F32 && ti.type != DType::BF16) fail("tensor '" + ti.name + "' is neither f32 nor bf16");
        StateArray a{ti.name, {}, {}};
        if (ti.type == DType::F32) a.data = {reinterpret_cast<const float *>(f->tensor_data(ti)), static_cast<size_t>(ti.nelements())};
        else a.bf16 = {reinterpret_cast<const uint16_t *>(f->tensor_data(ti)), static_cast<size_t>(ti.nelements())};
        arrays.push_back(std::move(a));
    }
    opt.load_state(static_cast<int64_t>(f->get_u64("rp.ckpt.opt_step")), arrays);

    st.step = static_cast<int64_t>(f->get_u64("rp.ckpt.step"));
    if (f->has("rp.ckpt.last_norm_bits")) {
        const uint64_t bits = f->get_u64("rp.ckpt.last_norm_bits");
        std::memcpy(&st.health.last_norm, &bits, sizeof bits);
        st.health.last_norm_step = f->get_i64("rp.ckpt.last_norm_step");
        st.health.last_skip = f->get_string("rp.ckpt.last_skip");
        st.health.bad_run = static_cast<int64_t>(f->get_u64("rp.ckpt.bad_run"));
    }
    st.grad_groups = f->get_u32_or("rp.ckpt.grad_groups", 1);
    st.data.seed = f->get_u64("rp.ckpt.data_seed");
    st.data.fingerprint = f->get_u64("rp.ckpt.data_fingerprint");
    st.data.consumed = f->get_u64("rp.ckpt.data_consumed");
    if (f->has("rp.ckpt.train_loss")) st.curve.train_loss = f->get_f32_array("rp.ckpt.train_loss");
    if (f->has("rp.ckpt.reference_logps")) st.reference_logps = f->get_f32_array("rp.ckpt.reference_logps");
    if (f->has("rp.ckpt.reward")) st.curve.reward = f->get_f32_array("rp.ckpt.reward");
    if (f->has("rp.ckpt.objective.ints"))
        for (int64_t x : f->get_int_array("rp.ckpt.objective.ints")) st.objective.ints.push_back(static_cast<int32_t>(x));
    if (f->has("rp.ckpt.objective.floats")) st.objective.floats = f->get_f32_array("rp.ckpt.objective.floats");
    st.objective.text = f->get_string_or("rp.ckpt.objective.text", "");
    if (f->has("rp.ckpt.reward_chosen")) {
        st.curve.reward_chosen = f->get_f32_array("rp.ckpt.reward_chosen");
        st.curve.reward_rejected = f->get_f32_array("rp.ckpt.reward_rejected");
    }
    if (f->has("rp.ckpt.eval_step")) {
        for (int64_t s : f->get_int_array("rp.ckpt.eval_step")) st.curve.eval_step.push_back(static_cast<int32_t>(s));
        st.curve.eval_loss = f->get_f32_array("rp.ckpt.eval_loss");
    }
    return st;
}

EvalProgress eval_progress(const TrainCurve & c) {
    EvalProgress p;
    for (size_t i = 0; i < c.eval_loss.size(); ++i) {
        if (p.best_step < 0 || c.eval_loss[i] < p.best_loss) {  // strictly better; NaN never is
            p.best_step = c.eval_step[i];
            p.best_loss = c.eval_loss[i];
            p.since_best = 0;
        } else {
            ++p.since_best;
        }
    }
    return p;
}

std::string checkpoint_run_config(const std::string & path) {
    auto f = gguf::Reader::open(path);
    if (f->get_string_or("general.type", "") != kType) return "";
    return f->get_string_or("rp.ckpt.run_config", "");
}

} // namespace rp
