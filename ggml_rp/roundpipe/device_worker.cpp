#include "ggml_rp/roundpipe/device_worker.h"

#include "base/error.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <array>
#include <exception>
#include <map>
#include <string>
#include <utility>

namespace rp {

// Memory of a finished job, freed once its last download-stream event has completed; it also keeps the call
// (whose pinned host buffers the job's copies read and write) alive until then.
struct DeviceWorker::Retired {
    std::shared_ptr<Event> done;
    std::vector<void *> buffers;
    std::shared_ptr<Call> call;
};

// Activation buffers of one stage for one micro-batch parity (a ring of two per stage per job).
struct DeviceWorker::ActSet {
    std::vector<void *> in;     // fwd/fused: [0]; bwd: one per checkpoint (stage grain: 1; layer grain: per layer)
    std::vector<void *> work;   // hidden buffers: layer outputs (fwd), layer inputs (fused / bwd recompute)
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
    std::vector<void *> owned;
    size_t bytes = 0;
    LayerMemory & layer(int l) { return mem[static_cast<size_t>(l - job.spec.layers.begin)]; }
};

DeviceWorker::DeviceWorker(Device & device, WorkerShared shared, FuzzDelay fuzz)
    : dev_(device), sh_(shared), fuzz_(fuzz), transfer_(device, shared.observer) {
    thread_ = std::make_unique<WorkQueue>([this](const std::string & e) { sh_.faults.record(dev_.name() + ": " + e); });
}

DeviceWorker::~DeviceWorker() {
    thread_.reset();  // finishes the queued jobs, then joins
    try {
        dev_.synchronize();
    } catch (...) {  // already recorded by the job that met it
    }
    retire(0);
}

void DeviceWorker::submit(std::shared_ptr<Job> job) {
    idle_.acquire();
    thread_->enqueue([this, job = std::move(job)] {
        run(job);
        idle_.release();
    });
}

void DeviceWorker::wait_idle() { thread_->wait_idle(); }

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
        for (void * p : r.buffers) dev_.free(p);
    }
}

void * DeviceWorker::take(Running & r, size_t bytes, const std::string & what) {
    void * p = nullptr;
    try {
        p = dev_.allocate(bytes, what);
    } catch (const Error &) {
        retire(0);  // the previous job may still hold memory: wait for it, then try once more
        p = dev_.allocate(bytes, what);
    }
    r.owned.push_back(p);
    r.bytes += (bytes + 255) / 256 * 256;  // as the arena rounds
    return p;
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
            sh_.faults.record(e.what());
            throw;  // poisons the stream
        }
    });
    c.add_timed({layer, kind, std::move(start), transfer_.record(StreamKind::Compute)});
}

void DeviceWorker::run_job(Job & job, std::vector<char> & released) {
    retire(1);  // at most two jobs' memory on a device: this one and the previous
    Call & c = *job.call;
    const JobSpec & spec = job.spec;
    TrainingProgram & prog = sh_.program;
    Running r{job, c, std::vector<LayerMemory>(static_cast<size_t>(spec.layers.size())), {}, 0};

    // Weights and gradient buffers of the job's layers.
    for (int l = spec.layers.begin; l < spec.layers.end; ++l)
        for (const auto & ti : prog.layer_tensors(l)) {
            r.layer(l).data.push_back(take(r, ti.bytes, ti.name));
            r.layer(l).grad.push_back(spec.has_grads && ti.param >= 0 ? static_cast<float *>(take(r, ti.bytes, ti.name + " grad"))
                                                                      : nullptr);
        }

    // Activation buffers: a ring of two sets per stage this job runs.
    std::map<int, std::array<ActSet, 2>> sets;
    for (const Task & t : spec.tasks) {
        if (sets.count(t.stage)) continue;
        const StageDesc & sd = c.stages[static_cast<size_t>(t.stage)];
        const int a = sd.layers.begin, b = sd.layers.end, k = sd.layers.size();
        const size_t H = c.max_hidden, I = c.max_tokens;
        const std::string tag = "activations " + sd.name;
        for (ActSet & s : sets[t.stage]) {
            const bool grads = sd.pass != Pass::Fwd;
            const bool layer_grain = sd.pass == Pass::Bwd && c.plan.grain == RecomputeGrain::Layer;
            if (layer_grain) {
                for (int l = a; l < b; ++l) s.in.push_back(take(r, l == 0 ? I : H, tag));  // every layer's checkpoint
            } else {
                s.in.push_back(take(r, a == 0 ? I : H, tag));
                // fwd: the outputs of layers a .. b-1; fused / bwd recompute: the inputs of layers a+1 .. b-1
                for (int i = sd.pass == Pass::Fwd ? 0 : 1; i < k; ++i) s.work.push_back(take(r, H, tag));
            }
            if (sd.pass == Pass::Fused) s.labels = take(r, I, tag);
            if (sd.pass == Pass::Bwd) s.dout = take(r, H, tag);
            if (grads) {
                s.d[0] = take(r, H, tag);
                s.d[1] = take(r, H, tag);
            }
            if (sd.pass == Pass::Fused) s.loss = static_cast<float *>(take(r, sizeof(float), tag));
        }
    }
    sh_.observer.job_memory(r.bytes);

    // The weights, and this step's running gradient sums back up with them (§5) or the buffers zeroed.
    const std::string cat = c.stages[static_cast<size_t>(spec.tasks.front().stage)].cat;
    std::vector<WeightCopy> copies;
    for (int l = spec.layers.begin; l < spec.layers.end; ++l) {
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i)
            copies.push_back({r.layer(l).data[i], sh_.store.upload_source(l, static_cast<int>(i)), ts[i].bytes});
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
        std::vector<std::pair<const void *, size_t>> spans;
        for (size_t i = 0; i < ts.size(); ++i) spans.emplace_back(r.layer(l).data[i], ts[i].bytes);
        sh_.observer.weights_bound(dev_.stream(StreamKind::Compute), OpLabel(spec.label, cat), c.id, l, spans);
    }
    transfer_.limit_prefetch();

    for (size_t k = 0; k < spec.tasks.size(); ++k) {
        const Task & t = spec.tasks[k];
        fuzz_.sleep();
        run_task(r, t, sets[t.stage][static_cast<size_t>(t.mb % 2)]);
        released[k] = 1;
    }

    // Gradients: D2H into the pinned slots after the last micro-batch (the slots are free: the controller
    // claimed them before dispatching).
    transfer_.downloads_after_compute();
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
    retired_.push_back({transfer_.record(StreamKind::Download), std::move(r.owned), job.call});
}

void DeviceWorker::run_task(Running & r, const Task & t, ActSet & s) {
    Call & c = r.call;
    TrainingProgram & prog = sh_.program;
    const StageDesc & sd = c.stages[static_cast<size_t>(t.stage)];
    const int a = sd.layers.begin, b = sd.layers.end, L = prog.num_layers();
    const size_t mi = static_cast<size_t>(t.mb);
    const MicroBatchInfo info = c.info[mi];
    const size_t H = prog.hidden_bytes(info), I = prog.token_bytes(info);
    const std::string tag = sd.name + " mb" + std::to_string(t.mb);
    const OpLabel up("A " + tag, sd.cat), down("D " + tag, sd.cat), run(tag, sd.cat);
    Stream & cs = dev_.stream(StreamKind::Compute);

    // 1. Order: the predecessor stage has enqueued this micro-batch (§9.2); this activation set is free.
    if (t.stage > 0) c.sem[static_cast<size_t>(t.stage - 1)]->acquire();
    if (s.free) dev_.stream(StreamKind::ActivationUpload).wait(*s.free);

    // 2. Uploads, each behind its producer's D2H (unset only when the producer failed: the call then reports
    //    that error), then the mark the compute stream and later weight uploads wait for.
    auto input = [&](int l, void * dst) {
        if (l == 0) transfer_.upload_activation(dst, c.ids[mi].data(), I, nullptr, up);
        else transfer_.upload_activation(dst, c.act[static_cast<size_t>(l)][mi].data(), H, c.act_ready[static_cast<size_t>(l)][mi].get(), up);
    };
    const bool layer_grain = sd.pass == Pass::Bwd && c.plan.grain == RecomputeGrain::Layer;
    if (sd.pass == Pass::Bwd)
        transfer_.upload_activation(s.dout, c.dact[static_cast<size_t>(b)][mi].data(), H, c.dact_ready[static_cast<size_t>(b)][mi].get(), up);
    if (layer_grain)
        for (int l = a; l < b; ++l) input(l, s.in[static_cast<size_t>(l - a)]);
    else
        input(a, s.in[0]);
    if (sd.pass == Pass::Fused) transfer_.upload_activation(s.labels, c.labels[mi].data(), I, nullptr, up);
    transfer_.activations_uploaded();
    if (s.free) cs.wait(*s.free);

    // 3. Programs (the layers' inputs: the uploaded one, then the hidden buffers of the set) and downloads.
    auto x = [&](int l) -> void * {
        if (layer_grain) return s.in[static_cast<size_t>(l - a)];
        if (l == a) return s.in[0];
        return s.work[static_cast<size_t>(l - a - (sd.pass == Pass::Fwd ? 0 : 1))];
    };
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
    // set's two buffers, from d[cur] on. Returns the gradient of layer a's input.
    auto backward_down = [&](int top, void * dout, int cur) {
        for (int l = top; l >= a; --l) {
            void * din = l == 0 ? nullptr : s.d[cur];
            backward(l, x(l), dout, din);
            if (l != 0) {
                dout = din;
                cur = 1 - cur;
            }
        }
        return dout;
    };
    switch (sd.pass) {
    case Pass::Fwd:
        for (int l = a; l < b; ++l) {
            void * out = s.work[static_cast<size_t>(l - a)];
            forward(l, l == a ? s.in[0] : s.work[static_cast<size_t>(l - 1 - a)], out);
            if (c.need_act[static_cast<size_t>(l + 1)])  // the next stage's input or a backward checkpoint
                c.act_ready[static_cast<size_t>(l + 1)][mi] = transfer_.download(c.act[static_cast<size_t>(l + 1)][mi].data(), out, H, down);
        }
        transfer_.downloads_after_compute();
        break;
    case Pass::Fused: {
        for (int l = a; l < L - 1; ++l) forward(l, x(l), x(l + 1));
        launch(c, L - 1, Call::Launch::Head, run, [&prog, w = r.layer(L - 1), in = x(L - 1), lab = s.labels, loss = s.loss, d0 = s.d[0], info](ProgramContext & pc) {
            prog.head(w, in, static_cast<const int32_t *>(lab), loss, d0, info, pc);
        });
        void * din = backward_down(L - 2, s.d[0], 1);  // the head wrote d[0]
        c.loss_ready[mi] = transfer_.download(c.loss.as<float>() + mi, s.loss, sizeof(float), OpLabel("D loss " + tag, sd.cat));
        if (a > 0) c.dact_ready[static_cast<size_t>(a)][mi] = transfer_.download(c.dact[static_cast<size_t>(a)][mi].data(), din, H, down);
        break;
    }
    case Pass::Bwd: {
        if (!layer_grain)  // recompute the stage's layer inputs from the checkpoint
            for (int l = a; l < b - 1; ++l) forward(l, x(l), x(l + 1));
        void * din = backward_down(b - 1, s.dout, 0);
        if (a > 0) c.dact_ready[static_cast<size_t>(a)][mi] = transfer_.download(c.dact[static_cast<size_t>(a)][mi].data(), din, H, down);
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
