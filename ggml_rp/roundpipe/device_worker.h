// One device's actor in the RoundPipe runtime (roundpipe.md §3.1, §3.2): a thread that takes jobs from the
// controller one at a time and ENQUEUES their work on the device's four streams, running ahead of them.
//
// A job (one upload of a stage's weights, then its tasks: one stage x one micro-batch each):
//   memory     weights, gradient buffers and a ring of two activation sets per stage it runs, from the
//              device's arena; the previous job's memory is retired (its download-stream event synchronized,
//              then freed) before the next-but-one allocates, so a device holds at most two jobs;
//   weights    through the transfer engine (transfer.h), with this step's running gradient sums re-uploaded
//              (or the buffers zeroed) on the way; then the layers' upload flags are set (layer_protocol.h);
//   tasks      each written once: wait for the predecessor stage's micro-batch (§9.2) and for the activation
//              set to be free; upload the inputs behind their producers' events; run the programs; download
//              the outputs, checkpoints and input gradients, recording the events consumers wait for;
//   gradients  after the last task: D2H into the host store's pinned slots, then the layers' download flags.
// A failing job records its error and releases everything it still owed (semaphores, flags), so no other
// thread waits forever; the controller rethrows the error.
#pragma once

#include "ggml_rp/roundpipe/call_state.h"
#include "ggml_rp/roundpipe/fault_report.h"
#include "ggml_rp/roundpipe/fuzz_delay.h"
#include "ggml_rp/roundpipe/host_store.h"
#include "ggml_rp/roundpipe/layer_protocol.h"
#include "ggml_rp/roundpipe/observer.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"
#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/roundpipe/transfer.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/work_queue.h"

#include <deque>
#include <memory>
#include <vector>

namespace rp {

// A job as the controller hands it over.
struct Job {
    std::shared_ptr<Call> call;
    JobSpec spec;
    std::vector<char> reupload;  // per layer of spec.layers: its gradient slot holds this step's running sum
};

// What every device worker shares: the program, the host store, the protocol, the observer, the error sink.
struct WorkerShared {
    TrainingProgram & program;
    HostStore & store;
    LayerProtocol & protocol;
    PipelineObserver & observer;
    FaultReport & faults;
    int threads = 1;  // CPU kernel threads of each program launch
};

class DeviceWorker {
public:
    DeviceWorker(Device & device, WorkerShared shared, FuzzDelay fuzz);
    ~DeviceWorker();  // finishes the queued jobs, waits for the device, frees every job's memory
    DeviceWorker(const DeviceWorker &) = delete;
    DeviceWorker & operator=(const DeviceWorker &) = delete;

    Device & device() { return dev_; }
    // Blocks until the previous job has been enqueued (the binary idle semaphore, §3.2), then queues this one.
    void submit(std::shared_ptr<Job> job);
    // Blocks until every submitted job has been enqueued on the streams.
    void wait_idle();

private:
    struct Retired;
    struct ActSet;
    struct Running;

    void run(const std::shared_ptr<Job> & job);
    void run_job(Job & job, std::vector<char> & released);
    void run_task(Running & r, const Task & t, ActSet & s);
    void retire(size_t keep);
    void * take(Running & r, size_t bytes, const std::string & what);
    void launch(Call & c, int layer, Call::Launch kind, OpLabel label, std::function<void(ProgramContext &)> program);

    Device & dev_;
    WorkerShared sh_;
    FuzzDelay fuzz_;
    TransferEngine transfer_;
    Semaphore idle_{1};
    std::deque<Retired> retired_;
    std::unique_ptr<WorkQueue> thread_;  // last: starts once everything above exists
};

} // namespace rp
