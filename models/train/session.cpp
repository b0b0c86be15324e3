#include "models/train/session.h"

#include "base/error.h"
#include "ggml_rp/optim/clip.h"
#include "gguf/gguf.h"
#include "models/arch/inference.h"
#include "models/arch/lora.h"
#include "models/text/tokenizer.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <span>
#include <thread>

namespace rp {

namespace {

SessionOptions checked(SessionOptions o, const Dataset & data) {
    if (o.batch < 1) throw Error("batch_size " + std::to_string(o.batch) + " must be at least 1");
    o.micro_batches = resolved_micro_batches(o);
    if (o.micro_batches < 1 || o.micro_batches > o.batch)
        throw Error("micro_batches " + std::to_string(o.micro_batches) + " must be in [1, batch_size = " + std::to_string(o.batch) + "]");
    if (o.epochs < 1) throw Error("epochs " + std::to_string(o.epochs) + " must be at least 1");
    if (o.steps < 0) throw Error("steps must be >= 0");
    if (!(o.clip >= 0) || !std::isfinite(o.clip)) throw Error("clip must be a finite number >= 0");
    if (o.threads < 0) throw Error("threads must be >= 0");
    if (data.size() == 0) throw Error("the dataset has no sequences");
    if (o.pipelined && o.devices.count < 1) throw Error("devices: a pipelined run needs at least one device");
    if (o.pipelined && !o.devices.memories.empty() && static_cast<int>(o.devices.memories.size()) != o.devices.count)
        throw Error("devices.memories: " + std::to_string(o.devices.memories.size()) + " memory sizes for " +
                    std::to_string(o.devices.count) + " devices (devices.count)");
    if (o.pipelined && !o.pipeline.device_speed.empty()) {
        const std::vector<double> & s = o.pipeline.device_speed;
        if (static_cast<int>(s.size()) != o.devices.count)
            throw Error("pipeline.device_speed: " + std::to_string(s.size()) + " speeds for " + std::to_string(o.devices.count) +
                        " devices (devices.count)");
        for (double v : s)
            if (!(v > 0) || !std::isfinite(v)) throw Error("pipeline.device_speed: " + std::to_string(v) + " is not a positive speed");
        // CPU virtual devices really run that much slower (the fastest at the host's speed); on GPUs the speeds
        // only tell the dispatcher what to expect instead of measuring.
        if (o.devices.backend == "cpu") {
            const double top = *std::max_element(s.begin(), s.end());
            o.devices.speeds.clear();
            for (double v : s) o.devices.speeds.push_back(v / top);
        }
    }
    if (o.max_bad_steps < 1) throw Error("max_bad_steps " + std::to_string(o.max_bad_steps) + " must be at least 1");
    const int64_t ranks = o.comm ? o.comm->size() : 1;
    if (o.accumulate_groups < 1 || o.accumulate_groups > o.micro_batches)
        throw Error("accumulate_groups " + std::to_string(o.accumulate_groups) + " must be in [1, micro_batches = " +
                    std::to_string(o.micro_batches) + "]");
    if (o.accumulate_groups > 1 && ranks > 1)
        throw Error("accumulate_groups is the single-process reference of a data-parallel run; this run has " +
                    std::to_string(ranks) + " ranks");
    if (o.accumulate_groups > 1 && o.pipelined)
        throw Error("accumulate_groups runs on the host (the pipeline equals the host bit for bit)");
    if (ranks > o.micro_batches)
        throw Error("micro_batches " + std::to_string(o.micro_batches) + " must be at least the number of data-parallel ranks (" +
                    std::to_string(ranks) + "): rank r computes micro-batches r, r + " + std::to_string(ranks) + ", ...");
    if (o.replica_check_every < 0) throw Error("replica_check_every must be >= 0");
    if (o.finetune.context == 0) o.finetune.context = data.seq_len();  // the RoPE factors of the sequences trained on
    o.finetune.answer_slots = data.pairs() || data.kto() ? data.answer_slots() : 1;  // (packed pairs: several per sequence)
    if (data.rollouts() != (o.objective != nullptr) || data.rollouts() != o.finetune.grpo.has_value())
        throw Error(data.rollouts() ? "a frame of prompts (GRPO) needs the GRPO objective and its step objective"
                                    : "the GRPO objective samples its sequences from prompts (a PromptSet's frame), not a dataset");
    if (data.rollouts() && o.val_split > 0) throw Error("val_split: GRPO has no validation split (its steps report the rewards)");
    const bool kto = o.finetune.preference && o.finetune.preference->method == PreferenceMethod::Kto;
    if (o.finetune.preference.has_value() != (data.pairs() || data.kto()))
        throw Error(data.kto()     ? "the dataset holds KTO examples: choose method kto"
                    : data.pairs() ? "the dataset holds preference pairs: choose a preference method (dpo, ipo, simpo, orpo)"
                                   : "a preference method trains on pairs ({\"prompt\", \"chosen\", \"rejected\"} lines) or KTO examples "
                                     "({\"prompt\", \"completion\", \"label\"}); the dataset holds SFT examples");
    if (o.finetune.preference && kto != data.kto())
        throw Error(kto ? "method kto trains on unpaired examples ({\"prompt\", \"completion\", \"label\"} lines); the dataset holds pairs"
                        : "the dataset holds KTO examples ({\"prompt\", \"completion\", \"label\"}): choose method kto");
    return o;
}

bool needs_reference(const SessionOptions & o) { return o.finetune.preference && preference_needs_reference(o.finetune.preference->method); }

// Mean loss over the unmasked tokens of the given sequences, each batch's summed loss from batch_loss (data parallel:
// each rank a share of the batches, the sums added over the ranks).
double eval_loss(const Dataset & data, const std::vector<uint32_t> & idx, int64_t batch, Communicator * comm,
                 const std::function<double(const Batch &)> & batch_loss) {
    double sum = 0;
    size_t n = 0;
    for (size_t b = 0, k = 0; b < idx.size(); b += static_cast<size_t>(batch), ++k) {
        if (comm && !in_group(k, comm->rank(), comm->size())) continue;  // data parallel: batches k = rank mod R
        const size_t e = std::min(idx.size(), b + static_cast<size_t>(batch));
        const Batch bt = make_batch(data, std::span<const uint32_t>(idx.data() + b, e - b));
        sum += batch_loss(bt);
        n += bt.n_trained();
    }
    if (comm && comm->size() > 1) {
        double total[2] = {sum, static_cast<double>(n)};
        comm->allreduce_sum(total, 2, "validation loss");
        sum = total[0];
        n = static_cast<size_t>(total[1]);
    }
    return n ? sum / static_cast<double>(n) : std::nan("");
}

// The first step for a reference to check against (bench/gpu/peft_baseline.py): its gradients before
// clipping, and what they came from — the batch (token ids, labels: -1 = masked), the loss scale, the loss,
// and the logits of the batch's first sequence at the step's weights, so another engine loading the same
// weights can compare logits, loss and gradients.
void dump_step(Trainer & tr, const Batch & bt, float loss_scale, double loss, int64_t step, const std::string & path) {
    gguf::Writer w;
    w.set_string("general.type", "rp.gradients");
    w.set_u32("rp.step", static_cast<uint32_t>(step + 1));
    w.set_f32("rp.loss", static_cast<float>(loss));
    w.set_f32("rp.loss_scale", loss_scale);
    for (const Trainer::Param & p : tr.params()) {
        const int64_t ne[3] = {p.t->ne[0], p.t->ne[1], p.t->ne[2]};
        w.add_tensor(p.name, DType::F32, p.t->ne[2] != 1 ? 3 : 2, ne, p.t->grad->data);  // expert tensors are 3-D
    }
    const int64_t ne_batch[2] = {bt.seq_len, bt.n_seq};
    w.add_tensor("batch.inputs", DType::I32, 2, ne_batch, bt.inputs.data());
    w.add_tensor("batch.labels", DType::I32, 2, ne_batch, bt.labels.data());
    if (!bt.positions.empty()) {  // packed: the positions the reference needs to reproduce the step
        w.add_tensor("batch.positions", DType::I32, 2, ne_batch, bt.positions.data());
    }
    const std::vector<float> logits = tr.logits(bt.inputs.data(), bt.seq_len, 0, bt.positions_or_null());
    const int64_t ne_logits[2] = {static_cast<int64_t>(logits.size()) / bt.seq_len, bt.seq_len};
    w.add_tensor("batch.logits0", DType::F32, 2, ne_logits, logits.data());
    w.write(path);
}

} // namespace

int64_t resolved_micro_batches(const SessionOptions & o) {
    return o.micro_batches != 0 ? o.micro_batches : o.comm ? o.comm->size() : 1;
}

std::vector<MicroBatchInfo> micro_batch_shapes(int64_t seq_len, int64_t n_seq, int64_t micro_batches, bool packed, int64_t group) {
    std::vector<MicroBatchInfo> out;
    const int64_t units = n_seq / group;
    for (int64_t mb = 0; mb < micro_batches; ++mb) {
        const int64_t lo = units * mb / micro_batches * group, hi = units * (mb + 1) / micro_batches * group;
        if (hi == lo) continue;
        MicroBatchInfo info;
        info.seq_len = seq_len;
        info.n_seq = hi - lo;
        info.seq_offset = lo;
        info.packed = packed;
        out.push_back(info);
    }
    return out;
}

TrainingSession::TrainingSession(const Model & model, const Dataset & data, SessionOptions options)
    : model_(model), data_(data), opt_(checked(std::move(options), data)), trainer_(model, opt_.finetune),
      split_(split_dataset(data.units(), opt_.val_split, opt_.finetune.seed)),
      batcher_(data, split_.train, static_cast<int32_t>(opt_.batch), opt_.finetune.seed), optimizer_(opt_.optimizer) {
    const int64_t steps_per_epoch = (static_cast<int64_t>(split_.train.size()) + opt_.batch - 1) / opt_.batch;
    total_ = opt_.steps > 0 ? opt_.steps : opt_.epochs * steps_per_epoch * (opt_.objective ? opt_.objective->steps_per_batch() : 1);
    opt_.lr.total_steps = total_;
    opt_.lr.validate();
    for (const Trainer::Param & p : trainer_.params()) slots_.push_back(optimizer_.add_param(p.name, static_cast<size_t>(p.t->nelements())));

    groups_ = opt_.comm ? opt_.comm->size() : opt_.accumulate_groups;
    if (opt_.comm && opt_.comm->size() > 1) {
        // Every rank must run the same job: the same model, configuration and data, and the same initial
        // weights (a mismatch would be a silent divergence, or a hang on mismatched messages).
        std::vector<uint64_t> fp;
        std::vector<std::string> names;
        auto add = [&](const std::string & name, uint64_t v) { fp.push_back(v), names.push_back(name); };
        add("base model", base_fingerprint(model_));
        add("number of trainable tensors", trainer_.params().size());
        add("dataset (its sequences and split)", batcher_.position().fingerprint);
        add("sequence length", static_cast<uint64_t>(data.seq_len()));
        add("batch_size", static_cast<uint64_t>(opt_.batch));
        add("micro_batches", static_cast<uint64_t>(opt_.micro_batches));
        add("steps", static_cast<uint64_t>(total_));
        add("seed", opt_.finetune.seed);
        add("pipelined", opt_.pipelined ? 1u : 0u);
        add("async", opt_.pipelined && opt_.pipeline.async ? 1u : 0u);
        const ReplicaHashes h = replica_hashes(trainer_, optimizer_);
        fp.insert(fp.end(), h.hashes.begin(), h.hashes.end());
        names.insert(names.end(), h.names.begin(), h.names.end());
        opt_.comm->check_same(fp, names, "data parallel: the ranks' jobs differ");
        grad_comm_ = opt_.comm->duplicate();
        reducer_ = std::make_unique<GradientReducer>(*grad_comm_, trainer_);
        if (opt_.pipelined)  // per layer on the optimizer thread, while the devices run earlier layers' backward
            opt_.pipeline.grads_complete = [this](int, const std::vector<int> & params) {
                for (int p : params) reducer_->add(p);
            };
    }

    if (opt_.pipelined) {
        devices_ = make_devices(opt_.devices);
        std::vector<Device *> ptrs;
        for (const auto & d : devices_) ptrs.push_back(d.get());
        const int hw = opt_.threads > 0 ? opt_.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        opt_.pipeline.threads_per_device = std::max(1, hw / static_cast<int>(devices_.size()));
        pipe_ = std::make_unique<Pipeline>(trainer_, ptrs, opt_.pipeline);
        // The largest step's plan and memory, now: a run that cannot fit is refused before it writes anything.
        const int64_t n_seq = std::min<int64_t>(opt_.batch, static_cast<int64_t>(split_.train.size())) * data.group();
        std::vector<MicroBatchInfo> shapes;  // data parallel: this rank's share
        const auto all = micro_batch_shapes(data.seq_len(), n_seq, opt_.micro_batches, data.packed(), data.group());
        for (size_t i = 0; i < all.size(); ++i)
            if (trains(i)) shapes.push_back(all[i]);
        planned_ = pipe_->plan_call(shapes);
    }
}

TrainingSession::~TrainingSession() = default;

std::string TrainingSession::resume(const std::string & path) {
    if (st_.step > 0 || first_step_ > 0) throw Error(path + ": resume must come before the first step");
    const auto file = gguf::Reader::open(path);
    const std::string type = file->get_string_or("general.type", "");
    if (type != "adapter") {
        const int64_t g = file->get_u32_or("rp.ckpt.grad_groups", 1);
        if (g != groups_)
            throw Error(path + ": the checkpoint's gradients were summed over " + std::to_string(g) + " data-parallel rank(s) (or groups); this run has " +
                        std::to_string(groups_) + ". Resume it with " + std::to_string(g) +
                        " ranks: the summation order, and so every bit of the run, depends on it (it is not re-sharded)");
    }
    std::string what;
    if (type == "adapter") {
        if (opt_.finetune.full) throw Error(path + ": a LoRA adapter cannot start a full finetune");
        auto init = LoraAdapter::load(path, model_);  // validates it against this base
        for (const LoraTensor & t : trainer_.adapter()->tensors()) {
            const LoraTensor * s = init->find(t.base);
            if (!s || s->a->nelements() != t.a->nelements() || s->b->nelements() != t.b->nelements())
                throw Error(path + ": has no pair of rank " + std::to_string(opt_.finetune.lora_rank) + " for '" + t.base +
                            "' (the adapter must match lora_rank and lora_targets)");
            tensor_set_f32(t.a, tensor_get_f32(s->a));
            tensor_set_f32(t.b, tensor_get_f32(s->b));
        }
        what = "starting from the weights of adapter " + path;
    } else {
        CheckpointState loaded = load_checkpoint(path, trainer_, optimizer_);
        {
            std::lock_guard<std::mutex> lk(norm_m_);
            st_ = std::move(loaded);
        }
        batcher_.seek(st_.data);
        first_step_ = st_.step;
        if (opt_.objective) {
            try {
                opt_.objective->restore(st_.objective);
            } catch (const Error & e) {
                throw Error(path + ": " + e.what());
            }
        }
        st_.objective = {};
        if (needs_reference(opt_) && st_.step > 0 && st_.reference_logps.size() != data_.n_answer_slots())
            throw Error(path + ": the checkpoint holds no reference log-probabilities for this dataset's " + std::to_string(data_.n_answer_slots()) +
                        " answers (the policy has moved since step 0: they cannot be computed again)");
        what = "resumed " + path + " at step " + std::to_string(st_.step);
    }
    // The pipeline's working copies were taken from the masters at construction: refresh them; an async run
    // continues from the weights its next step computes at (one update behind the masters).
    if (pipe_) {
        pipe_->synchronize();
        if (opt_.pipeline.async && !st_.working.empty()) pipe_->set_working_weights(st_.working);
    }
    st_.working.clear();
    return what;
}

void TrainingSession::update(int64_t step, const Batch & bt, float loss_scale, double loss) {
    const size_t n_trained = bt.n_trained();
    if (step == first_step_ && !opt_.dump_grads.empty() && (!opt_.comm || opt_.comm->rank() == 0)) dump_step(trainer_, bt, loss_scale, loss, step, opt_.dump_grads);
    std::vector<std::span<float>> grads;
    for (const Trainer::Param & p : trainer_.params()) grads.emplace_back(p.t->grad->data_as<float>(), static_cast<size_t>(p.t->nelements()));
    std::vector<std::span<const float>> cgrads(grads.begin(), grads.end());
    const double norm = grad_norm(cgrads);
    // Clipping's factor is applied as the update reads each gradient (the bits of clip_grad_norm then the update).
    const float scale = opt_.clip > 0 ? clip_scale(norm, opt_.clip) : 1.0f;
    const char * skip = n_trained == 0           ? "no trained tokens"
                        : !std::isfinite(loss)   ? "non-finite loss"
                        : !std::isfinite(norm)   ? "non-finite gradient norm"
                                                 : "";
    {
        std::lock_guard<std::mutex> lk(norm_m_);
        StepHealth & h = st_.health;
        h.last_norm = norm;
        h.last_norm_step = step + 1;
        h.last_skip = skip;
        if (!std::isfinite(loss) || !std::isfinite(norm)) ++h.bad_run;
        else if (!*skip) h.bad_run = 0;
    }
    if (*skip) return;  // not applied; step() reports it
    const float lr = static_cast<float>(opt_.lr.lr(step));
    // A host step accumulates its gradients into these buffers: the update zeroes them as it reads them, so the next
    // step needs no pass of its own to clear them. (A pipeline's hand-off overwrites them.)
    const GradientUse use{scale, !pipe_};
    for (size_t i = 0; i < trainer_.params().size(); ++i) {
        const Trainer::Param & p = trainer_.params()[i];
        optimizer_.update(slots_[i], std::span<float>(p.t->data_as<float>(), static_cast<size_t>(p.t->nelements())), grads[i], lr, use);
    }
    optimizer_.end_step();
    if (use.zero) grads_zero_ = true;
}

bool TrainingSession::reference_pass() {
    if (!needs_reference(opt_) || st_.reference_logps.size() == data_.n_answer_slots()) return false;
    if (st_.step > 0) throw Error("the reference pass must run before the first step (the reference is the step-0 policy)");
    std::vector<float> ref(data_.n_answer_slots());
    const size_t D = static_cast<size_t>(data_.answer_slots());  // answers per sequence
    std::vector<uint32_t> all(data_.units());
    for (size_t u = 0; u < all.size(); ++u) all[u] = static_cast<uint32_t>(u);
    for (size_t b = 0; b < all.size(); b += static_cast<size_t>(opt_.batch)) {
        const size_t e = std::min(all.size(), b + static_cast<size_t>(opt_.batch));
        const Batch bt = make_batch(data_, std::span<const uint32_t>(all.data() + b, e - b));
        float * out = ref.data() + b * static_cast<size_t>(data_.group()) * D;
        if (!pipe_) {
            const std::vector<float> lp =
                trainer_.sequence_logps(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, opt_.threads, bt.positions_or_null());
            std::copy(lp.begin(), lp.end(), out);
            continue;
        }
        // Through the devices: the step's micro-batch split, the heads' forward alone (each answer's log-probability).
        const std::vector<MicroBatch> mbs = micro_batches(bt, 0);
        const std::vector<std::vector<float>> res = pipe_->forward(mbs);
        for (size_t i = 0; i < res.size(); ++i) std::copy(res[i].begin() + 1, res[i].end(), out + static_cast<size_t>(mbs[i].info.seq_offset) * D);
    }
    st_.reference_logps = std::move(ref);
    return true;
}

StepReport TrainingSession::step() {
    if (!stopped_.empty()) throw Error("the run has stopped: " + stopped_);
    if (st_.step >= total_) throw Error("the run has done all its " + std::to_string(total_) + " steps");
    const auto t0 = std::chrono::steady_clock::now();
    const bool pref = opt_.finetune.preference.has_value();
    StepObjective * objective = opt_.objective;
    if (pref) reference_pass();
    const int64_t step = st_.step;
    Batch bt = !objective || step % objective->steps_per_batch() == 0 ? batcher_.next() : Batch{};
    if (objective && pipe_) pipe_->drain();  // the rollouts read the masters
    // SFT: the mean over the batch's trained tokens; preference: over its pairs; GRPO: its tokens' weights.
    BatchShare share;
    if (objective && reducer_ && bt.n_seq > 0) {  // data parallel: the sequences of this rank's micro-batches
        share.comm = opt_.comm;
        share.mine.assign(static_cast<size_t>(bt.n_seq), 0);
        const auto all = micro_batch_shapes(bt.seq_len, bt.n_seq, opt_.micro_batches, data_.packed(), data_.group());
        for (size_t i = 0; i < all.size(); ++i)
            if (trains(i)) std::fill_n(share.mine.begin() + all[i].seq_offset, all[i].n_seq, uint8_t{1});
    }
    const std::vector<float> seq_values = objective ? objective->prepare(trainer_, step, bt, share)
                                          : pref    ? preference_values(data_, bt, *opt_.finetune.preference, st_.reference_logps)
                                                    : std::vector<float>();
    const size_t n_trained = bt.n_trained();
    const float loss_scale = objective ? 1.0f
                             : pref    ? 1.0f / static_cast<float>(preference_pairs(seq_values))
                             : n_trained ? 1.0f / static_cast<float>(n_trained)
                                         : 0.0f;
    // What the heads read and report per sequence (preference: per answer slot; GRPO: per token).
    const bool values = pref || objective;
    const MicroBatchInfo whole{bt.seq_len, 1};
    const size_t per_seq_values = values ? trainer_.sequence_values(whole) : 0, per_seq_results = values ? trainer_.head_results(whole) - 1 : 0;
    std::vector<float> seq_logps(static_cast<size_t>(bt.n_seq) * per_seq_results, 0.0f);

    // The micro-batches: sequences [lo, hi) of the batch each, the same split on the host and in the pipeline;
    // data parallel: this rank's share (in_group), the others' on the other ranks.
    std::vector<MicroBatch> mbs = micro_batches(bt, step, loss_scale);
    if (values)
        for (MicroBatch & m : mbs) m.info.sequence_values = seq_values.data() + per_seq_values * static_cast<size_t>(m.info.seq_offset);
    // A micro-batch on the host: its loss; preference training keeps its sequences' log-probabilities.
    std::vector<float> results;
    auto accumulate = [&](const MicroBatch & m) {
        results.resize(trainer_.head_results(m.info));
        const double l = trainer_.accumulate(m.ids, m.labels, m.info, opt_.threads, results.data());
        if (values) std::copy(results.begin() + 1, results.end(), seq_logps.begin() + static_cast<std::ptrdiff_t>(m.info.seq_offset * per_seq_results));
        return l;
    };
    const bool dp = reducer_ != nullptr;
    if (dp) {  // this rank's share
        std::vector<MicroBatch> mine;
        for (size_t i = 0; i < mbs.size(); ++i)
            if (trains(i)) mine.push_back(mbs[i]);
        mbs = std::move(mine);
    }
    double loss = 0;
    // Data parallel, preference training: each rank has its micro-batches' log-probabilities, zeros elsewhere.
    auto gather_logps = [&] {
        if (!dp || !values) return;
        std::vector<double> all(seq_logps.begin(), seq_logps.end());
        opt_.comm->allreduce_sum(all.data(), all.size(), "sequence log-probabilities of step " + std::to_string(step + 1));
        std::copy(all.begin(), all.end(), seq_logps.begin());
    };
    if (pipe_) {
        std::vector<std::vector<float>> res;
        if (!mbs.empty()) loss = pipe_->forward_backward(mbs, values ? &res : nullptr);
        for (size_t i = 0; i < res.size(); ++i)
            std::copy(res[i].begin() + 1, res[i].end(), seq_logps.begin() + static_cast<std::ptrdiff_t>(mbs[i].info.seq_offset * per_seq_results));
        if (dp) opt_.comm->allreduce_sum(&loss, 1, "loss of step " + std::to_string(step + 1));
        gather_logps();
        // The update may run after step() returned (async): it owns a copy of the batch. Data parallel: the
        // hand-off before it all-reduces the gradients layer by layer (grads_complete).
        pipe_->step([this, step, bt, loss_scale, loss] { update(step, bt, loss_scale, loss); });
    } else if (groups_ > 1 && !dp) {  // the reference of a data-parallel run: the same grouping, in one process
        std::vector<std::vector<float>> sum;
        grads_zero_ = false;
        for (int64_t g = 0; g < groups_; ++g) {
            trainer_.zero_grads();
            double group_loss = 0;
            for (size_t i = 0; i < mbs.size(); ++i) {
                if (!in_group(i, g, groups_)) continue;
                group_loss += accumulate(mbs[i]);
            }
            trainer_.collect_grads();
            loss = g == 0 ? group_loss : loss + group_loss;
            const auto & params = trainer_.params();
            for (size_t p = 0; p < params.size(); ++p) {
                const float * gr = params[p].t->grad->data_as<float>();
                const size_t n = static_cast<size_t>(params[p].t->nelements());
                if (g == 0) {
                    sum.emplace_back(gr, gr + n);
                } else {
                    float * acc = sum[p].data();
                    for (size_t e = 0; e < n; ++e) acc[e] = acc[e] + gr[e];  // rank order, as allreduce_sum
                }
            }
        }
        const auto & params = trainer_.params();
        for (size_t p = 0; p < params.size(); ++p) std::copy(sum[p].begin(), sum[p].end(), params[p].t->grad->data_as<float>());
        update(step, bt, loss_scale, loss);
    } else {
        // The last update zeroed every gradient as it read them (and collect_grads leaves the tied head's slot at 0).
        if (!grads_zero_) trainer_.zero_grads();
        grads_zero_ = false;
        for (const MicroBatch & m : mbs) loss += accumulate(m);
        trainer_.collect_grads();
        if (dp) {
            reducer_->reduce_all();
            opt_.comm->allreduce_sum(&loss, 1, "loss of step " + std::to_string(step + 1));
            gather_logps();
        }
        update(step, bt, loss_scale, loss);
    }
    st_.step = step + 1;
    st_.data = batcher_.position();
    st_.curve.train_loss.push_back(static_cast<float>(loss));

    StepReport r;
    r.step = st_.step;
    r.loss = loss;
    r.lr = static_cast<float>(opt_.lr.lr(step));
    r.tokens = static_cast<int64_t>(bt.n_seq) * bt.seq_len;
    r.trained_tokens = static_cast<int64_t>(n_trained);
    if (pref) {
        PreferenceStats ps;
        ps.add(*opt_.finetune.preference, seq_logps.data(), seq_values.data(), static_cast<int64_t>(seq_logps.size()));
        r.preference = ps.mean();
        st_.curve.reward_chosen.push_back(static_cast<float>(r.preference->reward_chosen));
        st_.curve.reward_rejected.push_back(static_cast<float>(r.preference->reward_rejected));
    }
    if (objective) {
        objective->report(seq_logps, seq_values, r);
        if (r.grpo) st_.curve.reward.push_back(static_cast<float>(r.grpo->reward));
    }
    {
        std::lock_guard<std::mutex> lk(norm_m_);
        const StepHealth & h = st_.health;
        r.grad_norm = h.last_norm_step > 0 ? h.last_norm : std::nan("");
        r.grad_norm_step = h.last_norm_step;
        r.skipped = !h.last_skip.empty();
        r.skip_reason = h.last_skip;
        if (h.bad_run >= opt_.max_bad_steps) {
            const int64_t last = h.last_norm_step, first = last - h.bad_run + 1;
            stopped_ = "steps " + std::to_string(first) + ".." + std::to_string(last) + " had a non-finite loss or gradient norm (" +
                       std::to_string(h.bad_run) + " in a row, max_bad_steps " + std::to_string(opt_.max_bad_steps) +
                       "); none of them was applied: step " + std::to_string(first - 1) + "'s weights are the last good ones";
            r.stop = stopped_;
        }
    }
    if (dp && opt_.replica_check_every > 0 && st_.step % opt_.replica_check_every == 0)
        check_replicas("after step " + std::to_string(st_.step));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

double TrainingSession::evaluate() {
    if (split_.val.empty()) return std::nan("");
    if (pipe_) pipe_->drain();  // on the masters; the working weights (async: one update behind) stay
    if (opt_.finetune.preference) {
        reference_pass();
        PreferenceStats st;
        const double l = preference_eval_loss(trainer_, data_, split_.val, opt_.batch, opt_.threads, *opt_.finetune.preference,
                                              st_.reference_logps, st);
        eval_preference_ = st;
        return l;
    }
    // SFT: on the devices when the run has them in sync mode (the step's micro-batches, the heads' forward alone: each
    // micro-batch's summed loss), else on the host (async: the devices' working weights are one update behind the
    // masters, which an evaluation reads).
    return eval_loss(data_, split_.val, opt_.batch, opt_.comm, [&](const Batch & bt) {
        if (!pipe_ || opt_.pipeline.async) return trainer_.loss(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, 1.0f, opt_.threads, bt.positions_or_null());
        double sum = 0;
        for (const std::vector<float> & r : pipe_->forward(micro_batches(bt, st_.step))) sum += r[0];
        return sum;
    });
}

bool TrainingSession::trains(size_t micro_batch) const {
    return !reducer_ || in_group(micro_batch, opt_.comm->rank(), opt_.comm->size());
}

std::vector<MicroBatch> TrainingSession::micro_batches(const Batch & bt, int64_t step, float loss_scale) const {
    std::vector<MicroBatch> mbs;
    for (MicroBatchInfo info : micro_batch_shapes(bt.seq_len, bt.n_seq, opt_.micro_batches, data_.packed(), data_.group())) {
        const size_t off = static_cast<size_t>(info.seq_offset * bt.seq_len);
        MicroBatch m;
        m.ids = bt.inputs.data() + off;
        m.labels = bt.labels.data() + off;
        info.positions = bt.positions_or_null(off);
        info.step = step;
        info.loss_scale = loss_scale;
        m.info = info;
        mbs.push_back(m);
    }
    return mbs;
}

std::string TrainingSession::sample(const Tokenizer & tok, const std::string & prompt, int64_t max_tokens) {
    if (pipe_) pipe_->drain();  // as evaluate(): the masters, without changing the run's trajectory
    const std::vector<int32_t> ids = tok.encode(prompt, true, false);
    const int64_t n_ctx = std::min<int64_t>(model_.hparams().n_ctx_train, static_cast<int64_t>(ids.size()) + max_tokens);
    InferenceSession s(model_, n_ctx, opt_.threads, &trainer_.lora(), &trainer_.graph_weights());
    std::string text;
    for (const int32_t id : complete_greedy(s, tok, ids, max_tokens)) text += tok.token_to_piece(id, false);
    return text;
}

void TrainingSession::record_eval(int64_t step, double loss) {
    st_.curve.eval_step.push_back(static_cast<int32_t>(step));
    st_.curve.eval_loss.push_back(static_cast<float>(loss));
}

void TrainingSession::synchronize() {
    if (pipe_) pipe_->synchronize();
}

void TrainingSession::check_replicas(const std::string & when) {
    if (!opt_.comm || opt_.comm->size() == 1) return;
    if (pipe_) pipe_->drain();  // the masters hold every update; the working weights stay as they are
    const ReplicaHashes h = replica_hashes(trainer_, optimizer_);
    opt_.comm->check_same(h.hashes, h.names, "replica check " + when);
}

void TrainingSession::save_checkpoint(const std::string & path) {
    if (pipe_) pipe_->drain();  // not synchronize(): publishing the last update early would change an async run
    CheckpointState st;
    {
        std::lock_guard<std::mutex> lk(norm_m_);
        st = st_;
    }
    st.grad_groups = groups_;
    st.run_config = opt_.run_config;
    if (opt_.objective) st.objective = opt_.objective->state();
    if (pipe_ && opt_.pipeline.async)
        for (size_t p = 0; p < trainer_.params().size(); ++p) st.working_at.push_back(pipe_->working_weight(p));
    trainer_.free_graph_memory();
    rp::save_checkpoint(path, trainer_, optimizer_, st);
}

void TrainingSession::save_result(const std::string & path) {
    synchronize();
    trainer_.free_graph_memory();
    trainer_.save(path);
}

} // namespace rp
