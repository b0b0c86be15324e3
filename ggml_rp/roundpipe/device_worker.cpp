#include "ggml_rp/roundpipe/device_worker.h"

#include "base/error.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <algorithm>
#include <array>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace rp {

// A finished job: its last download-stream event (its weight slot and activations are free after it), and
// the call it keeps alive until then (the pinned host buffers its copies read and write).
struct DeviceWorker::Retired {
    std::shared_ptr<Event> done;
    std::shared_ptr<Call> call;
};

// One activation set of a stage, as pointers (layout_job's offsets into the activation region).
struct DeviceWorker::ActSet {
    std::vector<void *> in;     // fwd / fused / bwd stage grain: [0]; bwd layer grain: 1 or 2 checkpoints
    std::vector<void *> work;   // fwd: 1 or 2 outputs (ping-pong); fused / bwd stage grain: layer inputs
    void * labels = nullptr;
    void * dout = nullptr;
    void * d[2] = {nullptr, nullptr};
    float * loss = nullptr;
    std::shared_ptr<Event> free;  // the last D2H of the micro-batch that used it
};

// The job being enqueued: its memory, by layer.
struct DeviceWorker::Running {
    Job & job;
    Call & call;
    std::vector<LayerMemory> mem;  // per layer of job.spec.layers
    LayerMemory & layer(int l) { return mem[static_cast<size_t>(l - job.spec.layers.begin)]; }
};

DeviceWorker::DeviceWorker(int position, Device & device, WorkerShared shared, FuzzDelay fuzz)
    : position_(position), dev_(device), sh_(shared), fuzz_(fuzz), transfer_(device, shared.observer), resident_(layout_resident(shared.program)) {
    thread_ = std::make_unique<WorkQueue>([this](const std::string & e) { sh_.faults.record(dev_.name() + ": " + e); });
}

DeviceWorker::~DeviceWorker() {
    thread_.reset();  // finishes the queued jobs, then joins
    try {
        dev_.synchronize();
    } catch (...) {  // already recorded by the job that met it
    }
    retire(0);
    try {
        dev_.runner().set_region(nullptr, 0);
        dev_.free(block_);
        dev_.free(resident_block_);
    } catch (...) {  // a destructor must not throw
    }
}

DeviceMemoryPlan DeviceWorker::regions() const {
    std::lock_guard<std::mutex> lk(regions_m_);
    return regions_;
}

DeviceMemoryPlan DeviceWorker::regions_used() const {
    std::lock_guard<std::mutex> lk(regions_m_);
    DeviceMemoryPlan u = used_;
    u.graph = dev_.runner().region_high_water();
    return u;
}

size_t DeviceWorker::weight_bytes_uploaded() const {
    std::lock_guard<std::mutex> lk(regions_m_);
    return weight_bytes_up_;
}

void DeviceWorker::submit(std::shared_ptr<Job> job) {
    idle_.acquire();
    thread_->enqueue([this, job = std::move(job)] {
        run(job);
        idle_.release();
    });
}

void DeviceWorker::wait_idle() { thread_->wait_idle(); }

void DeviceWorker::release_calls() {
    idle_.acquire();
    thread_->enqueue([this] {
        try {
            retire(0);
        } catch (const std::exception & e) {  // a failed stream: on record, rethrown by the controller
            sh_.faults.record(dev_.name() + ": " + e.what());
        }
        idle_.release();
    });
    thread_->wait_idle();
}

void DeviceWorker::run(const std::shared_ptr<Job> & job) {
    std::vector<char> released(job->spec.tasks.size(), 0);
    try {
        run_job(*job, released);
    } catch (const std::exception & e) {
        sh_.faults.record(dev_.name() + ": job " + job->spec.label + ": " + e.what());
        // Keep every other thread moving: release what this job still owed.
        for (size_t k = 0; k < job->spec.tasks.size(); ++k)
            if (!released[k]) {
                const Task & t = job->spec.tasks[k];
                job->call->sem[static_cast<size_t>(t.stage)]->release();
                if (t.stage == job->call->fb) job->call->fused_done.release();
            }
        for (int l = job->spec.layers.begin; l < job->spec.layers.end; ++l)
            sh_.protocol.release_after_failure(l, job->spec.has_grads);
    }
}

void DeviceWorker::retire(size_t keep) {
    while (retired_.size() > keep) {
        Retired r = std::move(retired_.front());
        retired_.pop_front();
        if (r.done) r.done->synchronize();
    }
}

// The regions must hold `need`: when they do not, the device drains (every job retired, every stream idle)
// and the working block is carved again, large enough for both the old and the new need when that fits (so a
// plan that changes from call to call settles at once), else for the new one. The resident region is its own
// block, allocated first: a carve that keeps its size keeps it, and the frozen weights in it, so they go up once
// per device however often the call plans change (longer micro-batches, stages sized by speed). Two blocks, the
// resident one never moving below the working one: the arena does not fragment.
void DeviceWorker::ensure_regions(const DeviceMemoryPlan & need) {
    DeviceMemoryPlan want;
    {
        std::lock_guard<std::mutex> lk(regions_m_);
        if (block_ && regions_.covers(need)) return;
        want = block_ ? regions_.max(need) : need;
        // Both plans fit the device, their union may not: then exactly the new one (it was checked).
        if (want.peak() > dev_.capacity()) want = need;
    }
    retire(0);
    dev_.synchronize();
    dev_.runner().set_region(nullptr, 0);
    dev_.free(block_);
    block_ = nullptr;
    const bool keep_resident = resident_block_ && want.resident == regions_.resident;
    if (!keep_resident) {
        dev_.free(resident_block_);
        resident_block_ = nullptr;
        resident_loaded_ = false;
        if (want.resident > 0) resident_block_ = dev_.allocate(want.resident, "memory plan: " + format_bytes(want.resident) + " resident frozen weights");
    }
    const size_t working = want.peak() - want.resident;
    block_ = dev_.allocate(std::max<size_t>(working, 1), "memory plan: " + want.describe());
    dev_.runner().set_region(static_cast<char *>(block_) + 2 * want.weight_slot + want.activations, want.graph);
    std::lock_guard<std::mutex> lk(regions_m_);
    regions_ = want;
    activations_free_.reset();
}

void DeviceWorker::launch(Call & c, int layer, Call::Launch kind, OpLabel label, std::function<void(ProgramContext &)> program) {
    Stream & cs = dev_.stream(StreamKind::Compute);
    std::shared_ptr<Event> start = transfer_.record(StreamKind::Compute);
    ProgramContext pc;
    pc.runner = &dev_.runner();
    pc.n_threads = sh_.threads;
    cs.launch(std::move(label), [this, pc, program = std::move(program)]() mutable {
        try {
            program(pc);
        } catch (const std::exception & e) {
            sh_.faults.record(e.what(), FaultReport::Origin::Program);
            throw;  // poisons the stream
        }
    });
    c.add_timed({layer, kind, position_, std::move(start), transfer_.record(StreamKind::Compute)});
}

void DeviceWorker::run_job(Job & job, std::vector<char> & released) {
    retire(1);  // the weight slot of job n-2 (the other slot is the previous job's, maybe still computing)
    ensure_regions(job.memory);
    Call & c = *job.call;
    const JobSpec & spec = job.spec;
    TrainingProgram & prog = sh_.program;
    const JobLayout lay = layout_job(prog, c.stages, job.shape, spec);
    // The resident block, and the working block: [weight slot 0][weight slot 1][activations][graph].
    char * resident = static_cast<char *>(resident_block_);
    char * slot = static_cast<char *>(block_) + static_cast<size_t>(next_slot_) * regions_.weight_slot;
    char * acts = static_cast<char *>(block_) + 2 * regions_.weight_slot;
    next_slot_ ^= 1;
    if (job.shape.resident && regions_.resident < resident_.bytes)
        throw Error("job " + spec.label + " keeps the frozen weights resident (" + format_bytes(resident_.bytes) +
                    "); the memory plan carved " + regions_.describe() + " (the plan and the job's layout disagree)");
    Running r{job, c, std::vector<LayerMemory>(static_cast<size_t>(spec.layers.size()))};
    // A frozen tensor without a slot buffer is in the resident region, or streamed: its host bytes (the programs
    // upload what they read of them).
    auto frozen_at = [&](int l, size_t i) -> void * {
        if (job.shape.resident) return resident + resident_.data[static_cast<size_t>(l)][i];
        return const_cast<void *>(sh_.store.upload_source(l, static_cast<int>(i)));
    };
    for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
        const size_t k = static_cast<size_t>(l - spec.layers.begin);
        for (size_t i = 0; i < lay.data[k].size(); ++i) {
            r.layer(l).data.push_back(lay.data[k][i] == kNoBuffer ? frozen_at(l, i) : slot + lay.data[k][i]);
            r.layer(l).grad.push_back(lay.grad[k][i] == kNoBuffer ? nullptr : reinterpret_cast<float *>(slot + lay.grad[k][i]));
        }
    }
    auto at = [&](size_t off) -> void * { return off == kNoBuffer ? nullptr : acts + off; };
    std::map<int, std::array<ActSet, 2>> sets;
    for (const auto & [stage, layouts] : lay.sets)
        for (size_t i = 0; i < layouts.size(); ++i) {
            const ActSetLayout & L = layouts[i];
            ActSet & s = sets[stage][i];
            for (size_t o : L.in) s.in.push_back(at(o));
            for (size_t o : L.work) s.work.push_back(at(o));
            s.labels = at(L.labels);
            s.dout = at(L.dout);
            s.d[0] = at(L.d[0]);
            s.d[1] = at(L.d[1]);
            s.loss = static_cast<float *>(at(L.loss));
        }
    if (lay.weight_bytes > regions_.weight_slot || lay.activation_bytes > regions_.activations)
        throw Error("job " + spec.label + " needs " + format_bytes(lay.weight_bytes) + " of weights and " +
                    format_bytes(lay.activation_bytes) + " of activations; the memory plan carved " + regions_.describe() +
                    " (the plan and the job's layout disagree)");
    {
        std::lock_guard<std::mutex> lk(regions_m_);
        used_.weight_slot = std::max(used_.weight_slot, lay.weight_bytes);
        used_.activations = std::max(used_.activations, lay.activation_bytes);
        if (job.shape.resident) used_.resident = resident_.bytes;
    }
    sh_.observer.job_memory(lay.weight_bytes + lay.activation_bytes);
    // The activation region is the previous job's until its last download: the first upload waits for it.
    if (activations_free_) dev_.stream(StreamKind::ActivationUpload).wait(*activations_free_);

    // The weights, and this step's running gradient sums back up with them (§5) or the buffers zeroed.
    const std::string cat = c.stages[static_cast<size_t>(spec.tasks.front().stage)].cat;
    // The job's weights in the slot; the first resident job after a carve also fills the resident region
    // (every layer's frozen weights: they never change, so it is the last time they go up).
    std::vector<WeightCopy> copies;
    for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
        const auto & ts = prog.layer_tensors(l);
        const size_t k = static_cast<size_t>(l - spec.layers.begin);
        for (size_t i = 0; i < ts.size(); ++i)
            if (lay.data[k][i] != kNoBuffer)
                copies.push_back({r.layer(l).data[i], sh_.store.upload_source(l, static_cast<int>(i)), ts[i].bytes});
    }
    if (job.shape.resident && !resident_loaded_) {
        std::set<size_t> uploaded;  // offsets: a tensor layers share goes up once
        for (int l = 0; l < prog.num_layers(); ++l) {
            const auto & ts = prog.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                const size_t o = resident_.data[static_cast<size_t>(l)][i];
                if (o != kNoBuffer && uploaded.insert(o).second)
                    copies.push_back({resident + o, sh_.store.upload_source(l, static_cast<int>(i)), ts[i].bytes});
            }
        }
        resident_loaded_ = true;
    }
    {
        std::lock_guard<std::mutex> lk(regions_m_);
        for (const WeightCopy & w : copies) weight_bytes_up_ += w.bytes;
    }
    auto grads_in = [&](Stream & ws, Stream & cs) {
        if (!spec.has_grads) return;
        for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
            const auto & ts = prog.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                if (ts[i].param < 0) continue;
                void * g = r.layer(l).grad[i];
                if (job.reupload[static_cast<size_t>(l - spec.layers.begin)])
                    ws.copy(g, sh_.store.grad_slot(l, static_cast<int>(i)), ts[i].bytes, CopyKind::HostToDevice,
                            OpLabel("G up " + spec.label, cat));
                else
                    cs.launch(OpLabel("G zero " + spec.label, cat), [dev = &dev_, g, n = ts[i].bytes] { dev->runner().zero(g, n); });
            }
        }
    };
    const std::shared_ptr<Event> uploaded = transfer_.upload_weights(copies, OpLabel("W " + spec.label, cat), grads_in);
    for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
        sh_.protocol.upload_enqueued(l, uploaded);
        const auto & ts = prog.layer_tensors(l);
        std::vector<std::pair<const void *, size_t>> spans;  // (a streamed tensor is not bound: it stays on the host)
        for (size_t i = 0; i < ts.size(); ++i)
            if (!(job.shape.vocab_on_host && !job.shape.resident && ts[i].param < 0 && ts[i].vocab_rows > 0))
                spans.emplace_back(r.layer(l).data[i], ts[i].bytes);
        sh_.observer.weights_bound(dev_.stream(StreamKind::Compute), OpLabel(spec.label, cat), c.id, l, spans);
    }
    transfer_.limit_prefetch();

    for (size_t k = 0; k < spec.tasks.size(); ++k) {
        const Task & t = spec.tasks[k];
        fuzz_.sleep();
        std::array<ActSet, 2> & ring = sets[t.stage];
        run_task(r, t, ring[static_cast<size_t>(t.mb) % lay.sets.at(t.stage).size()]);
        released[k] = 1;
    }

    // The activation region is free once the last micro-batch's downloads are done (each waited for the compute
    // that read the region): the next job's first uploads need not wait for the gradients' downloads below, which
    // read the weight slot.
    transfer_.downloads_after_compute();
    activations_free_ = transfer_.record(StreamKind::Download);

    // Gradients: D2H into the pinned slots after the last micro-batch (the slots are free: the controller
    // claimed them before dispatching).
    if (spec.has_grads)
        for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
            if (!sh_.protocol.trainable(l)) continue;
            const auto & ts = prog.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                if (ts[i].param < 0) continue;
                transfer_.copy_down(sh_.store.grad_slot(l, static_cast<int>(i)), r.layer(l).grad[i], ts[i].bytes,
                                    OpLabel("G down " + spec.label, cat));
                sh_.observer.grad_downloaded(l, static_cast<int>(i));
            }
            sh_.protocol.grad_download_enqueued(l, transfer_.record(StreamKind::Download));
        }
    std::shared_ptr<Event> done = transfer_.record(StreamKind::Download);
    retired_.push_back({std::move(done), job.call});
}

void DeviceWorker::run_task(Running & r, const Task & t, ActSet & s) {
    Call & c = r.call;
    TrainingProgram & prog = sh_.program;
    const StageDesc & sd = c.stages[static_cast<size_t>(t.stage)];
    const int a = sd.layers.begin, b = sd.layers.end, L = prog.num_layers();
    const size_t mi = static_cast<size_t>(t.mb);
    const MicroBatchInfo info = c.info[mi];
    // (hidden states: S bytes at the start of their H-byte buffers; their gradients: H)
    const size_t H = prog.hidden_bytes(info), S = prog.boundary_bytes(info), I = prog.token_bytes(info);
    const std::string tag = sd.name + " mb" + std::to_string(t.mb);
    const OpLabel up("A " + tag, sd.cat), down("D " + tag, sd.cat), run(tag, sd.cat);
    Stream & cs = dev_.stream(StreamKind::Compute);
    Stream & as = dev_.stream(StreamKind::ActivationUpload);
    const bool layer_grain = sd.pass == Pass::Bwd && c.plan.grain == RecomputeGrain::Layer;

    // 1. Order: the predecessor stage has enqueued this micro-batch (§9.2); this activation set is free.
    if (t.stage > 0) c.sem[static_cast<size_t>(t.stage - 1)]->acquire();
    if (s.free) as.wait(*s.free);

    // 2. Uploads, each behind its producer's D2H (unset only when the producer failed: the call then reports
    //    that error), then the mark the compute stream and later weight uploads wait for. Layer grain uploads
    //    each layer's checkpoint just before its backward (step 3).
    auto input = [&](int l, void * dst) {
        if (l == 0) transfer_.upload_activation(dst, c.ids[mi].data(), I, nullptr, up);
        else transfer_.upload_activation(dst, c.act[static_cast<size_t>(l)][mi].data(), S, c.act_ready[static_cast<size_t>(l)][mi].get(), up);
    };
    if (sd.pass == Pass::Bwd)
        transfer_.upload_activation(s.dout, c.dact(b, t.mb), H, c.dact_ready[static_cast<size_t>(b)][mi].get(), up);
    if (!layer_grain) input(a, s.in[0]);
    if (sd.pass == Pass::Fused) transfer_.upload_activation(s.labels, c.labels[mi].data(), I, nullptr, up);
    if (!layer_grain) transfer_.activations_uploaded();
    if (s.free) cs.wait(*s.free);

    // 3. Programs and downloads. The inputs of the layers: the uploaded one, then the set's hidden buffers.
    auto x = [&](int l) -> void * { return l == a ? s.in[0] : s.work[static_cast<size_t>(l - a - 1)]; };
    auto forward = [&](int l, void * in, void * out) {
        launch(c, l, Call::Launch::Forward, run, [&prog, l, w = r.layer(l), in, out, info](ProgramContext & pc) {
            prog.forward(l, w, in, out, info, pc);
        });
    };
    auto backward = [&](int l, void * in, void * dout, void * din) {
        launch(c, l, Call::Launch::RecomputeBackward, run, [&prog, l, w = r.layer(l), in, dout, din, info](ProgramContext & pc) {
            prog.backward(l, w, in, dout, din, info, pc);
        });
    };
    // Backward from layer `top` down to a, starting from dout; the input gradients alternate between the
    // set's two buffers, from d[cur] on; `in_of` gives each layer's input. Returns layer a's input gradient.
    auto backward_down = [&](int top, void * dout, int cur, const std::function<void *(int)> & in_of) {
        for (int l = top; l >= a; --l) {
            void * din = l == 0 ? nullptr : s.d[cur];
            backward(l, in_of(l), dout, din);
            if (l != 0) {
                dout = din;
                cur = 1 - cur;
            }
        }
        return dout;
    };
    switch (sd.pass) {
    case Pass::Fwd: {
        // Outputs alternate between two buffers; one is overwritten only once its download (if any) is done.
        std::shared_ptr<Event> downloaded[2];
        for (int l = a; l < b; ++l) {
            const size_t k = static_cast<size_t>(l - a) % s.work.size();
            void * out = s.work[k];
            if (downloaded[k]) cs.wait(*downloaded[k]);
            forward(l, l == a ? s.in[0] : s.work[static_cast<size_t>(l - a - 1) % s.work.size()], out);
            downloaded[k].reset();
            if (c.need_act[static_cast<size_t>(l + 1)]) {  // the next stage's input or a backward checkpoint
                downloaded[k] = transfer_.download(c.act[static_cast<size_t>(l + 1)][mi].data(), out, S, down);
                c.act_ready[static_cast<size_t>(l + 1)][mi] = downloaded[k];
            }
        }
        transfer_.downloads_after_compute();
        break;
    }
    case Pass::Fused: {
        for (int l = a; l < L - 1; ++l) forward(l, x(l), x(l + 1));
        if (c.forward_only) {  // Pipeline::forward: the head's results, no backward
            launch(c, L - 1, Call::Launch::Head, run, [&prog, w = r.layer(L - 1), in = x(L - 1), lab = s.labels, res = s.loss, info](ProgramContext & pc) {
                prog.head_forward(w, in, static_cast<const int32_t *>(lab), res, info, pc);
            });
            c.loss_ready[mi] = transfer_.download(c.loss.as<float>() + c.loss_at[mi], s.loss, sizeof(float) * prog.head_results(info),
                                                  OpLabel("D results " + tag, sd.cat));
            break;
        }
        launch(c, L - 1, Call::Launch::Head, run, [&prog, w = r.layer(L - 1), in = x(L - 1), lab = s.labels, loss = s.loss, d0 = s.d[0], info](ProgramContext & pc) {
            prog.head(w, in, static_cast<const int32_t *>(lab), loss, d0, info, pc);
        });
        void * din = backward_down(L - 2, s.d[0], 1, x);  // the head wrote d[0]
        c.loss_ready[mi] = transfer_.download(c.loss.as<float>() + c.loss_at[mi], s.loss, sizeof(float) * prog.head_results(info),
                                              OpLabel("D loss " + tag, sd.cat));
        if (a > 0) c.dact_ready[static_cast<size_t>(a)][mi] = transfer_.download(c.dact(a, t.mb), din, H, down);
        break;
    }
    case Pass::Bwd: {
        void * din = nullptr;
        if (layer_grain) {
            // Each layer's checkpoint into one of two buffers, uploaded while the layer above computes; a buffer
            // is overwritten only after the backward that read it (two layers above) has run.
            std::shared_ptr<Event> read[2];
            auto checkpoint = [&](int l) { return s.in[static_cast<size_t>(b - 1 - l) % s.in.size()]; };
            std::function<void *(int)> in_of = [&](int l) {
                const size_t k = static_cast<size_t>(b - 1 - l) % s.in.size();
                if (read[k]) as.wait(*read[k]);
                input(l, checkpoint(l));
                transfer_.activations_uploaded();
                return checkpoint(l);
            };
            void * dout = s.dout;
            int cur = 0;
            for (int l = b - 1; l >= a; --l) {
                void * g = l == 0 ? nullptr : s.d[cur];
                backward(l, in_of(l), dout, g);
                read[static_cast<size_t>(b - 1 - l) % s.in.size()] = transfer_.record(StreamKind::Compute);
                if (l != 0) {
                    dout = g;
                    cur = 1 - cur;
                }
            }
            din = dout;
        } else {
            for (int l = a; l < b - 1; ++l) forward(l, x(l), x(l + 1));  // recompute the stage's layer inputs
            din = backward_down(b - 1, s.dout, 0, x);
        }
        // The buffer this download overwrites was last read by the upload of the stage above this one (the same
        // micro-batch) before that stage computed the gradient this stage starts from (so it is complete).
        if (a > 0) c.dact_ready[static_cast<size_t>(a)][mi] = transfer_.download(c.dact(a, t.mb), din, H, down);
        else transfer_.downloads_after_compute();
        break;
    }
    }

    // 4. Release: the set is free after this micro-batch's last D2H; the next stage may enqueue it.
    s.free = transfer_.record(StreamKind::Download);
    c.sem[static_cast<size_t>(t.stage)]->release();
    if (t.stage == c.fb) c.fused_done.release();
}

} // namespace rp
