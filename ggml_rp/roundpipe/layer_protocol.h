// The per-layer half of RoundPipe's synchronisation protocol (roundpipe.md §9.1): for every layer, host flags
// paired with device events, as named operations of the actor that performs them. The flags follow the
// "started" rule: a flag is set only after its event was recorded, so a consumer waits the flag before it
// waits (or synchronizes) the event — waiting on an unrecorded event would silently pass.
//
//   controller (dispatch)   claim_upload: the layer's weights are this step's (param_copied) and the last
//                           upload of the layer has been enqueued (param_upload_started, cleared here so the
//                           next upload is ordered after this job's) — edges 2, 3, 4;
//                           claim_grad_slot: the pinned gradient slot is free (grad_copied) and its last D2H
//                           of this step is complete (grad_download_started + the event) — edges 5, 6;
//   device thread           upload_enqueued / grad_download_enqueued: record-then-set;
//                           release_after_failure: a failed job sets what it owed, so nobody waits forever;
//   optimizer thread        wait_uploads_complete (every upload so far done: no torn weights, edge 1),
//                           param_copied, wait_grad_downloaded (edge 7), grad_copied;
//   controller (step)       begin_step: every layer copied back and handed off before the next step's flags.
//
// Every method is thread-safe; the controller-only state (whether a slot holds this step's running sum) is
// touched by the controller's methods only.
#pragma once

#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/runtime/device.h"

#include <memory>
#include <mutex>
#include <vector>

namespace rp {

class LayerProtocol {
public:
    // trainable[l]: layer l has gradient slots (its grad flags take part).
    explicit LayerProtocol(const std::vector<bool> & trainable);
    LayerProtocol(const LayerProtocol &) = delete;
    LayerProtocol & operator=(const LayerProtocol &) = delete;

    int num_layers() const { return static_cast<int>(layers_.size()); }
    bool trainable(int l) const { return layer(l).trainable; }

    // ---- controller: before handing a job over ----
    void claim_upload(int l);
    // Returns true when the slot already holds a running sum of this step (the job uploads it back, §5).
    bool claim_grad_slot(int l);

    // ---- device thread ----
    void upload_enqueued(int l, std::shared_ptr<Event> uploaded);
    void grad_download_enqueued(int l, std::shared_ptr<Event> downloaded);
    void release_after_failure(int l, bool had_grads);

    // ---- optimizer thread ----
    void wait_uploads_complete();
    void param_copied(int l);
    void wait_grad_downloaded(int l);
    void grad_copied(int l);

    // ---- controller: step() ----
    void begin_step();

private:
    struct Layer {
        HostFlag param_copied{true};
        HostFlag param_upload_started{true};
        HostFlag grad_download_started{true};
        HostFlag grad_copied{true};
        bool trainable = false;
        bool grad_pending = false;  // controller only: the slot holds this step's running sum

        std::mutex m;
        std::vector<std::shared_ptr<Event>> uploads;  // weight uploads since the last copy-back
        std::shared_ptr<Event> grad_downloaded;       // the slot's last D2H
    };
    Layer & layer(int l) const;

    std::vector<std::unique_ptr<Layer>> layers_;
};

} // namespace rp
