#include "ggml_rp/roundpipe/host_store.h"

#include "base/error.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/clock.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>

namespace rp {

namespace {

constexpr uintptr_t kPage = 4096;

// A whole-page span to register, writable when any range in it is.
struct PageSpan {
    uintptr_t begin, end;
    bool writable;
};

// [begin, end) ranges rounded out to whole pages, sorted, overlapping and touching ones merged.
std::vector<PageSpan> page_spans(const std::vector<std::pair<uintptr_t, uintptr_t>> & read_only,
                                 const std::vector<std::pair<uintptr_t, uintptr_t>> & writable) {
    std::vector<PageSpan> r;
    for (const auto & [b, e] : read_only) r.push_back({b, e, false});
    for (const auto & [b, e] : writable) r.push_back({b, e, true});
    for (PageSpan & s : r) {
        s.begin = s.begin / kPage * kPage;
        s.end = (s.end + kPage - 1) / kPage * kPage;
    }
    std::sort(r.begin(), r.end(), [](const PageSpan & a, const PageSpan & b) { return a.begin < b.begin; });
    std::vector<PageSpan> out;
    for (const PageSpan & s : r) {
        if (!out.empty() && s.begin <= out.back().end) {
            out.back().end = std::max(out.back().end, s.end);
            out.back().writable = out.back().writable || s.writable;
        } else {
            out.push_back(s);
        }
    }
    return out;
}

// The frozen tensors' host byte ranges, each once (a tensor two layers share, a tied head, appears once).
std::vector<std::pair<uintptr_t, uintptr_t>> frozen_ranges(const TrainingProgram & prog) {
    std::set<std::pair<uintptr_t, uintptr_t>> seen;
    for (int l = 0; l < prog.num_layers(); ++l)
        for (const auto & ti : prog.layer_tensors(l))
            if (ti.param < 0 && ti.bytes > 0) {
                const auto b = reinterpret_cast<uintptr_t>(ti.host);
                seen.insert({b, b + ti.bytes});
            }
    return {seen.begin(), seen.end()};
}

} // namespace

const char * frozen_pinning_name(FrozenPinning p) {
    switch (p) {
    case FrozenPinning::Copy: return "alloc";
    case FrozenPinning::Register: return "register";
    case FrozenPinning::Pageable: return "off";
    }
    return "?";
}

std::optional<FrozenPinning> parse_frozen_pinning(std::string_view name) {
    for (FrozenPinning p : {FrozenPinning::Copy, FrozenPinning::Register, FrozenPinning::Pageable})
        if (name == frozen_pinning_name(p)) return p;
    return std::nullopt;
}

FrozenPinning default_frozen_pinning(bool accelerator) { return accelerator ? FrozenPinning::Copy : FrozenPinning::Register; }

std::string FrozenPinningReport::describe() const {
    std::string s = std::string("frozen weights pinned by ") + (mode == FrozenPinning::Copy ? "copy (alloc)" : mode == FrozenPinning::Register ? "registration" : "nothing (off)");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f s", seconds);
    s += " in " + std::string(secs) + ": ";
    std::string parts;
    auto part = [&](size_t bytes, const char * what) {
        if (bytes) parts += (parts.empty() ? "" : ", ") + format_bytes(bytes) + " " + what;
    };
    part(copied, "copied into pinned memory");
    part(registered, "registered in place");
    part(pageable, "pageable");
    s += parts.empty() ? "none" : parts;
    if (masters_registered || masters_pageable) {
        s += "; masters and gradients shared in place (sync steps): ";
        parts.clear();
        part(masters_registered, "registered");
        part(masters_pageable, "pageable");
        s += parts;
    }
    return s;
}

std::vector<std::vector<char>> gradient_slots_in_place(const TrainingProgram & prog, bool share_masters) {
    const int L = prog.num_layers();
    const size_t P = prog.param_infos().size();
    std::vector<std::vector<char>> in_place(static_cast<size_t>(L));
    std::vector<char> seen(P, 0);
    for (int l = L - 1; l >= 0; --l) {  // hand_off's order: the highest layer first
        for (const auto & ti : prog.layer_tensors(l)) {
            const bool first = share_masters && ti.param >= 0 && static_cast<size_t>(ti.param) < P && !seen[static_cast<size_t>(ti.param)];
            if (first) seen[static_cast<size_t>(ti.param)] = 1;
            in_place[static_cast<size_t>(l)].push_back(first ? 1 : 0);
        }
    }
    return in_place;
}

HostStoreBytes host_store_bytes(const TrainingProgram & prog, bool share_masters) {
    HostStoreBytes b;
    if (!share_masters)
        for (const auto & pi : prog.param_infos()) b.working += pi.n * sizeof(float);
    const std::vector<std::vector<char>> in_place = gradient_slots_in_place(prog, share_masters);
    for (int l = 0; l < prog.num_layers(); ++l) {
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i)
            if (ts[i].param >= 0 && !in_place[static_cast<size_t>(l)][i]) b.slots += ts[i].bytes;
    }
    return b;
}

HostStore::HostStore(const TrainingProgram & prog, Device & host, FrozenPinning pinning, bool share_masters)
    : prog_(prog), host_(host), share_masters_(share_masters) {
    const auto & params = prog.param_infos();
    if (!share_masters_)
        for (const auto & pi : params) {
            working_.emplace_back(host, pi.n * sizeof(float));
            std::memcpy(working_.back().data(), pi.master, pi.n * sizeof(float));
        }
    const int L = prog.num_layers();
    const std::vector<std::vector<char>> in_place = gradient_slots_in_place(prog, share_masters_);
    std::vector<char> shared_slot(params.size(), 0);
    slots_.resize(static_cast<size_t>(L));
    slot_at_.resize(static_cast<size_t>(L));
    for (int l = L - 1; l >= 0; --l) {
        auto & slots = slots_[static_cast<size_t>(l)];
        auto & at = slot_at_[static_cast<size_t>(l)];
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i) {
            const auto & ti = ts[i];
            if (ti.param >= 0) {
                if (ti.param >= static_cast<int>(params.size()) || params[static_cast<size_t>(ti.param)].n * sizeof(float) != ti.bytes)
                    throw Error("pipeline: tensor '" + ti.name + "' of layer " + prog.layer_name(l) + " does not match its parameter");
                const size_t p = static_cast<size_t>(ti.param);
                if (in_place[static_cast<size_t>(l)][i]) {
                    if (!params[p].grad) throw Error("pipeline: parameter '" + params[p].name + "' has no gradient buffer");
                    shared_slot[p] = 1;
                    slots.emplace_back();
                    at.push_back(params[p].grad);
                } else {
                    slots.emplace_back(host, ti.bytes);
                    at.push_back(slots.back().as<float>());
                }
            } else {
                if (!ti.host) throw Error("pipeline: frozen tensor '" + ti.name + "' has no host data");
                slots.emplace_back();
                at.push_back(nullptr);
            }
        }
    }
    for (int l = 0; l < L; ++l) {
        size_t bytes = 0, train = 0;
        for (const auto & ti : prog.layer_tensors(l)) {
            bytes += ti.bytes;
            if (ti.param >= 0) train += ti.bytes;
        }
        layer_bytes_.push_back(bytes);
        layer_train_bytes_.push_back(train);
    }
    frozen_src_.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l)
        for (const auto & ti : prog.layer_tensors(l)) frozen_src_[static_cast<size_t>(l)].push_back(ti.param < 0 ? ti.host : nullptr);
    // Sync steps: the masters and gradients the devices read and write in place.
    std::vector<std::pair<uintptr_t, uintptr_t>> writable;
    if (share_masters_)
        for (size_t p = 0; p < params.size(); ++p) {
            const auto m = reinterpret_cast<uintptr_t>(params[p].master);
            writable.push_back({m, m + params[p].n * sizeof(float)});
            if (shared_slot[p]) {
                const auto g = reinterpret_cast<uintptr_t>(params[p].grad);
                writable.push_back({g, g + params[p].n * sizeof(float)});
            }
        }
    pinning_.mode = pinning;
    const double t0 = clock_us();
    switch (pinning) {
    case FrozenPinning::Copy:
        pin_by_copy();
        pin_by_registering(false, writable);
        break;
    case FrozenPinning::Register: pin_by_registering(true, writable); break;
    case FrozenPinning::Pageable:
        for (const auto & [b, e] : frozen_ranges(prog)) pinning_.pageable += e - b;
        pin_by_registering(false, writable);
        break;
    }
    pinning_.seconds = (clock_us() - t0) * 1e-6;
    completes_.resize(static_cast<size_t>(L));
    std::vector<char> seen(params.size(), 0);
    for (int l = 0; l < L; ++l)
        for (const auto & ti : prog.layer_tensors(l))
            if (ti.param >= 0 && !seen[static_cast<size_t>(ti.param)]) {
                seen[static_cast<size_t>(ti.param)] = 1;
                completes_[static_cast<size_t>(l)].push_back(ti.param);
            }
}

void HostStore::pin_by_registering(bool frozen, const std::vector<std::pair<uintptr_t, uintptr_t>> & writable) {
    for (const PageSpan & s : page_spans(frozen ? frozen_ranges(prog_) : std::vector<std::pair<uintptr_t, uintptr_t>>{}, writable)) {
        void * p = reinterpret_cast<void *>(s.begin);
        const size_t bytes = s.end - s.begin;
        try {
            host_.register_host(p, bytes, /*read_only=*/!s.writable);
            registered_.push_back(p);
            (s.writable ? pinning_.masters_registered : pinning_.registered) += bytes;
        } catch (const Error &) {
            // copied from pageable memory: slower, the same bytes
            (s.writable ? pinning_.masters_pageable : pinning_.pageable) += bytes;
        }
    }
}

void HostStore::pin_by_copy() {
    // One pinned buffer per layer for the frozen tensors it is the first to hold, each tensor 256-byte aligned
    // (the alignment the device arenas use); a tensor seen in an earlier layer uploads from that copy.
    constexpr size_t kAlign = 256;
    std::map<const void *, const void *> copy_of;
    for (int l = 0; l < num_layers(); ++l) {
        const auto & ts = prog_.layer_tensors(l);
        size_t bytes = 0;
        for (const auto & ti : ts)
            if (ti.param < 0 && ti.bytes > 0 && !copy_of.count(ti.host)) bytes += (ti.bytes + kAlign - 1) / kAlign * kAlign;
        if (bytes == 0) continue;
        PinnedBuffer buf;
        try {
            buf = PinnedBuffer(host_, bytes);
        } catch (const Error &) {
            buf = PinnedBuffer();  // no pinned memory left: this layer's tensors upload from pageable memory
        }
        size_t off = 0;
        for (size_t i = 0; i < ts.size(); ++i) {
            const auto & ti = ts[i];
            if (ti.param >= 0 || ti.bytes == 0) continue;
            if (const auto it = copy_of.find(ti.host); it != copy_of.end()) {
                frozen_src_[static_cast<size_t>(l)][i] = it->second;
                continue;
            }
            if (!buf.data()) {
                pinning_.pageable += ti.bytes;
                copy_of[ti.host] = ti.host;
                continue;
            }
            char * dst = buf.as<char>() + off;
            std::memcpy(dst, ti.host, ti.bytes);
            off += (ti.bytes + kAlign - 1) / kAlign * kAlign;
            pinning_.copied += ti.bytes;
            copy_of[ti.host] = dst;
            frozen_src_[static_cast<size_t>(l)][i] = dst;
        }
        if (buf.data()) frozen_copies_.push_back(std::move(buf));
    }
}

HostStore::~HostStore() {
    for (void * p : registered_) {
        try { host_.unregister_host(p); } catch (...) {}  // a destructor must not throw
    }
}

std::vector<bool> HostStore::trainable_layers() const {
    std::vector<bool> t;
    for (size_t b : layer_train_bytes_) t.push_back(b > 0);
    return t;
}

const void * HostStore::upload_source(int l, int i) const {
    const auto & ti = prog_.layer_tensors(l)[static_cast<size_t>(i)];
    return ti.param >= 0 ? working(static_cast<size_t>(ti.param)) : frozen_src_[static_cast<size_t>(l)][static_cast<size_t>(i)];
}

void * HostStore::grad_slot(int l, int i) const { return slot_at_[static_cast<size_t>(l)][static_cast<size_t>(i)]; }

const float * HostStore::working(size_t p) const {
    return share_masters_ ? prog_.param_infos()[p].master : static_cast<const float *>(working_[p].data());
}

float * HostStore::working(size_t p) {
    return share_masters_ ? prog_.param_infos()[p].master : static_cast<float *>(working_[p].data());
}

size_t HostStore::working_bytes() const {
    size_t b = 0;
    for (const PinnedBuffer & w : working_) b += w.size();
    return b;
}

size_t HostStore::slot_bytes() const {
    size_t b = 0;
    for (const auto & layer : slots_)
        for (const PinnedBuffer & s : layer) b += s.size();
    return b;
}

void HostStore::copy_back(LayerProtocol & protocol, const std::function<void()> & between_layers) {
    // Every weight upload enqueued so far has completed (no torn weights, §9.1 edge 1) — all layers, since a
    // shared tensor may have been uploaded by another layer.
    protocol.wait_uploads_complete();
    const auto & params = prog_.param_infos();
    std::vector<char> copied(params.size(), 0);
    for (int l = 0; l < num_layers(); ++l) {
        for (const auto & ti : prog_.layer_tensors(l)) {
            if (ti.param < 0 || copied[static_cast<size_t>(ti.param)]) continue;
            const auto & pi = params[static_cast<size_t>(ti.param)];
            if (!share_masters_) std::memcpy(working_[static_cast<size_t>(ti.param)].data(), pi.master, pi.n * sizeof(float));
            copied[static_cast<size_t>(ti.param)] = 1;
        }
        protocol.param_copied(l);
        if (between_layers) between_layers();
    }
}

void HostStore::hand_off(LayerProtocol & protocol, PipelineObserver & observer, int64_t calls,
                         const std::function<void()> & between_layers, const GradsComplete & grads_complete) {
    const auto & params = prog_.param_infos();
    std::vector<char> touched(params.size(), 0);
    if (calls == 0) {  // no micro-batch this step: zero gradients (the slots hold an earlier step's)
        for (size_t p = 0; p < params.size(); ++p) std::memset(params[p].grad, 0, params[p].n * sizeof(float));
        for (int l = num_layers() - 1; l >= 0; --l) {
            protocol.grad_copied(l);
            if (grads_complete && !completes_[static_cast<size_t>(l)].empty()) grads_complete(l, completes_[static_cast<size_t>(l)]);
        }
        return;
    }
    for (int l = num_layers() - 1; l >= 0; --l) {  // deep layers finish first
        if (protocol.trainable(l)) {
            protocol.wait_grad_downloaded(l);
            const auto & ts = prog_.layer_tensors(l);
            for (size_t i = 0; i < ts.size(); ++i) {
                if (ts[i].param < 0) continue;
                const auto & pi = params[static_cast<size_t>(ts[i].param)];
                const float * src = slot_at_[static_cast<size_t>(l)][i];
                if (!touched[static_cast<size_t>(ts[i].param)]) {
                    if (src != pi.grad) std::memcpy(pi.grad, src, pi.n * sizeof(float));
                    touched[static_cast<size_t>(ts[i].param)] = 1;
                } else {
                    for (size_t e = 0; e < pi.n; ++e) pi.grad[e] = pi.grad[e] + src[e];
                }
                observer.grad_handed_off(l, static_cast<int>(i), calls);
            }
        }
        protocol.grad_copied(l);
        if (grads_complete && !completes_[static_cast<size_t>(l)].empty()) grads_complete(l, completes_[static_cast<size_t>(l)]);
        if (between_layers) between_layers();
    }
    for (size_t p = 0; p < params.size(); ++p)
        if (!touched[p]) observer.param_unowned(static_cast<int>(p));
}

void HostStore::refresh_working() {
    if (share_masters_) return;
    const auto & params = prog_.param_infos();
    for (size_t p = 0; p < params.size(); ++p) std::memcpy(working_[p].data(), params[p].master, params[p].n * sizeof(float));
}

} // namespace rp
