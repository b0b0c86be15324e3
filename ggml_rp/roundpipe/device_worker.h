// One device's actor in the RoundPipe runtime (roundpipe.md §3.1, §3.2): a thread that takes jobs from the
// controller one at a time and ENQUEUES their work on the device's four streams, running ahead of them.
//
// A job (one upload of a stage's weights, then its tasks: one stage x one micro-batch each):
//   memory     the regions of the memory plan (memory_plan.h), carved once from the device's arena (again
//              only when a call's plan needs more, after the device has drained): the frozen weights in the
//              resident region when the call keeps them there (its own block, uploaded with the first job
//              after it was allocated and kept through later carves, read by every job after it), the job's
//              other weights and
//              gradient buffers in weight slot (n mod 2) — so the slot of job n-2 is retired first (its
//              download-stream event synchronized) — and its activation sets in the activation region, which
//              the job's first upload takes over once the previous job's last download is done; every buffer
//              at the offset layout_job gives it;
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
#include "ggml_rp/roundpipe/memory_plan.h"
#include "ggml_rp/roundpipe/observer.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"
#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/roundpipe/transfer.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/work_queue.h"

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace rp {

// A job as the controller hands it over.
struct Job {
    std::shared_ptr<Call> call;
    JobSpec spec;
    std::vector<char> reupload;  // per layer of spec.layers: its gradient slot holds this step's running sum
    CallShape shape;             // what its buffers are sized by
    DeviceMemoryPlan memory;     // the regions every device needs for the job's call
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
    // position: the device's index in the pipeline's list (what its timed launches are tagged with).
    DeviceWorker(int position, Device & device, WorkerShared shared, FuzzDelay fuzz);
    ~DeviceWorker();  // finishes the queued jobs, waits for the device, frees every job's memory
    DeviceWorker(const DeviceWorker &) = delete;
    DeviceWorker & operator=(const DeviceWorker &) = delete;

    Device & device() { return dev_; }
    // Blocks until the previous job has been enqueued (the binary idle semaphore, §3.2), then queues this one.
    void submit(std::shared_ptr<Job> job);
    // Blocks until every submitted job has been enqueued on the streams.
    void wait_idle();
    // Blocks until every submitted job has been enqueued, then retires them all (their last downloads waited
    // for) and drops the calls they held, so that those calls' pinned host buffers go back to the pool before the
    // next call takes its own (a sync step: one call's buffers at a time).
    void release_calls();
    // The regions as carved (the largest plan this device has run), and the most each has held: a job's
    // weights and gradients, its activation sets, one program's graph (read it once the device is idle).
    DeviceMemoryPlan regions() const;
    DeviceMemoryPlan regions_used() const;
    // Bytes of weights this device has been sent (the resident region's and every job's), read when idle.
    size_t weight_bytes_uploaded() const;

private:
    struct Retired;
    struct ActSet;
    struct Running;

    void run(const std::shared_ptr<Job> & job);
    void run_job(Job & job, std::vector<char> & released);
    void run_task(Running & r, const Task & t, ActSet & s);
    void retire(size_t keep);
    void ensure_regions(const DeviceMemoryPlan & need);
    void launch(Call & c, int layer, Call::Launch kind, OpLabel label, std::function<void(ProgramContext &)> program);

    int position_;
    Device & dev_;
    WorkerShared sh_;
    FuzzDelay fuzz_;
    TransferEngine transfer_;
    Semaphore idle_{1};
    std::deque<Retired> retired_;
    // The regions (memory_plan.h) in two blocks of the device's arena: the resident region (null when it is
    // empty), kept across carves of the same size, and the working regions.
    void * resident_block_ = nullptr;
    void * block_ = nullptr;
    mutable std::mutex regions_m_;  // regions_ is read by regions() from other threads
    DeviceMemoryPlan regions_;
    DeviceMemoryPlan used_;
    size_t weight_bytes_up_ = 0;     // under regions_m_
    const ResidentLayout resident_;  // where the frozen weights go in the resident region
    bool resident_loaded_ = false;   // the resident region holds them (since it was allocated)
    int next_slot_ = 0;
    std::shared_ptr<Event> activations_free_;  // the last job's last activation download: its region is free after it
    std::unique_ptr<WorkQueue> thread_;  // last: starts once everything above exists
};

} // namespace rp
