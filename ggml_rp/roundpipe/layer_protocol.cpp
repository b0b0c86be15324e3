#include "ggml_rp/roundpipe/layer_protocol.h"

#include "base/error.h"

#include <string>
#include <utility>

namespace rp {

LayerProtocol::LayerProtocol(const std::vector<bool> & trainable) {
    for (bool t : trainable) {
        layers_.push_back(std::make_unique<Layer>());
        layers_.back()->trainable = t;
    }
}

LayerProtocol::Layer & LayerProtocol::layer(int l) const {
    if (l < 0 || l >= num_layers())
        throw Error("layer protocol: layer " + std::to_string(l) + " outside [0, " + std::to_string(num_layers()) + ")");
    return *layers_[static_cast<size_t>(l)];
}

void LayerProtocol::claim_upload(int l) {
    Layer & ly = layer(l);
    ly.param_copied.wait();
    ly.param_upload_started.wait_and_clear();
}

bool LayerProtocol::claim_grad_slot(int l) {
    Layer & ly = layer(l);
    ly.grad_copied.wait();
    ly.grad_download_started.wait_and_clear();
    std::shared_ptr<Event> last;
    {
        std::lock_guard<std::mutex> lk(ly.m);
        last = ly.grad_downloaded;
    }
    if (last) last->synchronize();  // edge 6: the previous D2H into the slot is complete
    return std::exchange(ly.grad_pending, true);
}

void LayerProtocol::upload_enqueued(int l, std::shared_ptr<Event> uploaded) {
    Layer & ly = layer(l);
    {
        std::lock_guard<std::mutex> lk(ly.m);
        ly.uploads.push_back(std::move(uploaded));
    }
    ly.param_upload_started.set();
}

void LayerProtocol::grad_download_enqueued(int l, std::shared_ptr<Event> downloaded) {
    Layer & ly = layer(l);
    {
        std::lock_guard<std::mutex> lk(ly.m);
        ly.grad_downloaded = std::move(downloaded);
    }
    ly.grad_download_started.set();
}

void LayerProtocol::release_after_failure(int l, bool had_grads) {
    Layer & ly = layer(l);
    if (!ly.param_upload_started.is_set()) ly.param_upload_started.set();
    if (had_grads && ly.trainable && !ly.grad_download_started.is_set()) ly.grad_download_started.set();
}

void LayerProtocol::wait_uploads_complete() {
    for (auto & ly : layers_) {
        ly->param_upload_started.wait();
        std::vector<std::shared_ptr<Event>> uploads;
        {
            std::lock_guard<std::mutex> lk(ly->m);
            uploads = std::exchange(ly->uploads, {});
        }
        for (const auto & ev : uploads) ev->synchronize();
    }
}

void LayerProtocol::param_copied(int l) { layer(l).param_copied.set(); }

void LayerProtocol::wait_grad_downloaded(int l) {
    Layer & ly = layer(l);
    ly.grad_download_started.wait();
    std::shared_ptr<Event> last;
    {
        std::lock_guard<std::mutex> lk(ly.m);
        last = ly.grad_downloaded;
    }
    if (last) last->synchronize();
}

void LayerProtocol::grad_copied(int l) { layer(l).grad_copied.set(); }

void LayerProtocol::begin_step() {
    for (auto & ly : layers_) {
        ly->param_copied.wait_and_clear();
        ly->grad_copied.wait_and_clear();
        ly->grad_pending = false;
    }
}

} // namespace rp
