// The host store of the RoundPipe runtime (roundpipe.md §5, §6): the model state that lives in host memory
// between jobs, and the two optimizer-thread operations on it.
//
//   working copies   what the devices upload of every trainable parameter. Async steps: an f32 pinned copy,
//                    the weights before the last update (the update runs while the next step's jobs read
//                    them). Sync steps (share_masters): the masters themselves, registered in place: no job
//                    runs during an update, so a copy would only hold the same bytes again. Frozen tensors
//                    upload straight from the program's host bytes, e.g. the mmap'd GGUF;
//   gradient slots   one f32 slot per (layer, trainable tensor), reused across steps: a backward job's
//                    gradients land there, and go back up with the weights when a later call of the same step
//                    continues the sum (§5). Async steps: pinned buffers (this step's backward fills them while
//                    the optimizer reads the last step's gradients). Sync steps: the slot of a parameter's
//                    highest layer is its gradient itself (registered in place); only a tied parameter's other
//                    slots are buffers;
//   hand_off         slots -> the fp32 gradients the optimizer reads (layers in reverse order, a tied
//                    parameter's slots summed in that order; a slot that is the gradient needs no copy), once
//                    each layer's last D2H is complete; a step without calls (a data-parallel rank without
//                    micro-batches) hands off zeros. After each layer it tells grads_complete which parameters
//                    that layer completed (their lowest owning layer): a data-parallel run all-reduces them
//                    there, behind the backward of earlier layers;
//   copy_back        masters -> working copies, once every upload so far has completed, layer by layer (sync
//                    steps: nothing to copy);
//   frozen tensors   their host bytes (the mmap'd GGUF, or heap copies) made pinned in one of the three ways
//                    of FrozenPinning (roundpipe.md §6's pin modes): a copy from pageable memory is staged by
//                    the driver through a bounce buffer and blocks the host; from pinned memory it is one DMA,
//                    asynchronous. What cannot be pinned (no pinned memory left, no read-only registration on
//                    that GPU, a range already registered by another user) stays pageable: the copies are
//                    slower, the bytes the same.
// The store owns the data; the layer protocol (layer_protocol.h) says when each actor may touch it.
#pragma once

#include "ggml_rp/roundpipe/layer_protocol.h"
#include "ggml_rp/roundpipe/observer.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rp {

// How the frozen tensors' host bytes become pinned memory for their uploads.
enum class FrozenPinning {
    Copy,      // "alloc": copied into pinned buffers (one per layer) when the store is made: one more copy of
               // the frozen weights in RAM, the fastest uploads, and the usual path (cudaHostAlloc)
    Register,  // "register": pinned where they are (cudaHostRegister over whole pages, read-only for an mmap'd
               // file): no second copy, but pinning a file mapping can take long (llama.cpp keeps it opt-in)
    Pageable,  // "off": nothing pinned; every upload is staged by the driver (a model larger than RAM)
};
const char * frozen_pinning_name(FrozenPinning p);  // "alloc", "register", "off"
// Parses those names; nullopt for anything else.
std::optional<FrozenPinning> parse_frozen_pinning(std::string_view name);
// The mode a run uses when none is asked for: a copy for accelerators (their uploads are DMA), registration
// for CPU virtual devices (whose "pinned" memory is plain host memory: only the bookkeeping is exercised).
FrozenPinning default_frozen_pinning(bool accelerator);

// What the store did with the frozen tensors (every byte is in exactly one of the three).
struct FrozenPinningReport {
    FrozenPinning mode = FrozenPinning::Register;
    size_t copied = 0;      // into pinned buffers
    size_t registered = 0;  // pinned in place (whole pages, so at least the tensors' bytes)
    size_t pageable = 0;    // left pageable: asked for, or pinning failed
    // Sync steps: the masters and gradients the devices read and write in place (registered, or left pageable
    // when registration failed).
    size_t masters_registered = 0, masters_pageable = 0;
    double seconds = 0;     // the time pinning took
    std::string describe() const;  // e.g. "3.21 GiB copied into pinned memory in 2.1 s"
};

// Which gradient slots are the parameter's fp32 gradient itself, [layer][tensor]: with share_masters (sync steps),
// each parameter's first slot in hand_off's order (its highest layer's); none otherwise.
std::vector<std::vector<char>> gradient_slots_in_place(const TrainingProgram & prog, bool share_masters);

// The pinned bytes a HostStore holds for the trainable parameters (what the memory plan counts): the working
// copies (async steps) and the gradient slots that are not the gradient itself.
struct HostStoreBytes {
    size_t working = 0, slots = 0;
};
HostStoreBytes host_store_bytes(const TrainingProgram & prog, bool share_masters);

class HostStore {
public:
    // Validates the program's tensors (trainable ones match their parameter, frozen ones have host data),
    // allocates pinned memory through `host` (a device of the run) and pins the frozen tensors as `pinning`
    // says. share_masters (sync steps only): the devices upload the masters and write the gradients in place
    // (see above). Throws rp::Error naming the tensor.
    HostStore(const TrainingProgram & prog, Device & host, FrozenPinning pinning = FrozenPinning::Register,
              bool share_masters = false);
    ~HostStore();  // unregisters the frozen tensors' pages
    HostStore(const HostStore &) = delete;
    HostStore & operator=(const HostStore &) = delete;

    const FrozenPinningReport & frozen_pinning() const { return pinning_; }
    // The frozen tensors' pages: registered with the devices, and left pageable.
    size_t frozen_registered_bytes() const { return pinning_.registered; }
    size_t frozen_pageable_bytes() const { return pinning_.pageable; }

    int num_layers() const { return static_cast<int>(layer_bytes_.size()); }
    // Bytes a layer uploads (its tensors as the device holds them), and of those, the trainable ones.
    const std::vector<size_t> & layer_bytes() const { return layer_bytes_; }
    const std::vector<size_t> & layer_train_bytes() const { return layer_train_bytes_; }
    std::vector<bool> trainable_layers() const;

    // What tensor i of layer l uploads: the working copy of a trainable tensor, else the frozen tensor's pinned
    // copy or the program's host bytes.
    const void * upload_source(int l, int i) const;
    // The pinned gradient slot of trainable tensor i of layer l.
    void * grad_slot(int l, int i) const;

    // Optimizer thread (between_layers runs after each layer: the race fuzz's delays).
    void copy_back(LayerProtocol & protocol, const std::function<void()> & between_layers);
    using GradsComplete = std::function<void(int layer, const std::vector<int> & params)>;
    void hand_off(LayerProtocol & protocol, PipelineObserver & observer, int64_t calls,
                  const std::function<void()> & between_layers, const GradsComplete & grads_complete = {});

    // Working copies = masters (after everything has stopped: synchronize()).
    void refresh_working();
    // The working copy of param p: the weights the devices upload (async: the update before the last one; sync:
    // the master).
    const float * working(size_t p) const;
    float * working(size_t p);
    // Pinned bytes the store holds for the trainable parameters: working copies and gradient slots.
    size_t working_bytes() const;
    size_t slot_bytes() const;

private:
    const TrainingProgram & prog_;
    Device & host_;
    void pin_by_copy();
    // Registers the frozen tensors (when `frozen`) and the shared masters and gradients (`writable`) in place,
    // their ranges merged into whole-page spans (a span with a writable range is registered writable).
    void pin_by_registering(bool frozen, const std::vector<std::pair<uintptr_t, uintptr_t>> & writable);
    bool share_masters_ = false;

    std::vector<void *> registered_;  // page-aligned starts of the frozen ranges registered with host_
    FrozenPinningReport pinning_;
    std::vector<PinnedBuffer> frozen_copies_;            // Copy: one per layer that has frozen tensors not seen before
    std::vector<std::vector<const void *>> frozen_src_;  // [layer][tensor]: where a frozen tensor uploads from
    std::vector<PinnedBuffer> working_;               // per param (async steps only)
    std::vector<std::vector<PinnedBuffer>> slots_;    // [layer][tensor], empty for frozen tensors and shared slots
    std::vector<std::vector<float *>> slot_at_;       // [layer][tensor]: where the slot is (nullptr: frozen)
    std::vector<size_t> layer_bytes_, layer_train_bytes_;
    std::vector<std::vector<int>> completes_;         // [layer]: the params whose lowest owning layer it is
};

} // namespace rp
