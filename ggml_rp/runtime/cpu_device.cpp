#include "ggml_rp/runtime/cpu_device.h"

#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/mapped_arena.h"
#include "ggml_rp/runtime/clock.h"
#include "base/error.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>

namespace rp {

namespace {

// Page-aligned host memory (like cudaHostAlloc); a request the host cannot meet is an rp::Error naming the
// device, the size and what it was for, not std::bad_alloc.
std::byte * host_alloc(size_t bytes, const std::string & device, const char * what) {
    try {
        return static_cast<std::byte *>(::operator new(bytes, std::align_val_t(4096)));
    } catch (const std::bad_alloc &) {
        throw Error(device + ": the host cannot allocate " + format_bytes(bytes) + " for " + what);
    }
}

// The device's memory: anonymous pages, committed as they are touched (as the kernel's overcommit policy
// allows: a size beyond what the host could ever provide is refused here, by name, not at first touch).
// mmap rather than operator new so that the sanitizers' allocators, which abort on a request they cannot
// meet, report it the same way.
std::byte * map_device_memory(size_t bytes, const std::string & device) {
    void * p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw Error(device + ": the host cannot provide " + format_bytes(bytes) + " for the device's memory (" +
                    std::strerror(errno) + ")");
    return static_cast<std::byte *>(p);
}

// A one-shot completion flag: one per record() call.
struct Marker {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    double done_us = 0;  // rp::clock_us() at completion

    void set() {
        {
            std::lock_guard<std::mutex> lk(m);
            done = true;
            done_us = clock_us();
        }
        cv.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return done; });
    }
    bool is_done() {
        std::lock_guard<std::mutex> lk(m);
        return done;
    }
    bool completion(double & us) {
        std::lock_guard<std::mutex> lk(m);
        us = done_us;
        return done;
    }
};

// An event is the marker of its most recent record (none = never recorded).
class CpuEvent final : public Event {
public:
    std::shared_ptr<Marker> latest() {
        std::lock_guard<std::mutex> lk(m_);
        return latest_;
    }
    void set_latest(std::shared_ptr<Marker> marker) {
        std::lock_guard<std::mutex> lk(m_);
        latest_ = std::move(marker);
    }
    bool query() override {
        auto marker = latest();
        return !marker || marker->is_done();
    }
    void synchronize() override {
        if (auto marker = latest()) marker->wait();
    }
    double elapsed_ms(Event & start) override;

private:
    std::mutex m_;
    std::shared_ptr<Marker> latest_;
};

CpuEvent & as_cpu_event(Event & ev, const std::string & device) {
    auto * ce = dynamic_cast<CpuEvent *>(&ev);
    if (!ce) throw Error(device + ": an event of another device kind cannot be used with a CPU virtual device");
    return *ce;
}

double CpuEvent::elapsed_ms(Event & start) {
    auto * other = dynamic_cast<CpuEvent *>(&start);
    if (!other) throw Error("elapsed_ms: the start event belongs to another device kind");
    auto a = other->latest(), b = latest();
    double ta = 0, tb = 0;
    if (!a || !b) throw Error("elapsed_ms: an event was never recorded");
    if (!a->completion(ta) || !b->completion(tb)) throw Error("elapsed_ms: an event has not completed yet");
    return (tb - ta) / 1e3;
}

// A simplex link: the time until which it is reserved.
struct Link {
    std::mutex m;
    double free_at_us = 0;
};

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

} // namespace

struct CpuDevice::Impl {
    int index;
    std::string name;
    CpuDeviceOptions opt;

    MappedArena & mem;

    Link h2d, d2h;

    std::mutex pinned_m;
    std::map<const void *, size_t> registered;

    std::atomic<int64_t> allocs{0}, copies{0}, launches{0};  // for FaultPlan
    std::atomic<double> speed{1.0};
    // The fault of the nth operation of a kind, or nullptr.
    std::exception_ptr fault(std::atomic<int64_t> & count, int64_t at, const char * kind, int stream, const std::string & what) {
        const int64_t n = ++count;
        if (at <= 0 || n != at) return nullptr;
        return std::make_exception_ptr(Error(name + (stream >= 0 ? " stream " + stream_name(stream) : std::string()) +
                                             ": injected fault: " + kind + " #" + std::to_string(n) + " (" + what + ") failed"));
    }

    Impl(int idx, std::string nm, CpuDeviceOptions o, MappedArena & m)
        : index(idx), name(std::move(nm)), opt(std::move(o)), mem(m) {
        speed = opt.speed;
        if (mem.capacity() > 0) mem.set_base(map_device_memory(mem.capacity(), name));
    }
    ~Impl() {
        if (mem.base()) munmap(mem.base(), mem.capacity());
    }

};

namespace {

class CpuStream final : public Stream {
public:
    CpuStream(CpuDevice::Impl & dev, int index) : dev_(dev), index_(index) {
        if (dev_.opt.delay_seed != 0) {
            rng_.seed(splitmix64(dev_.opt.delay_seed ^ splitmix64(uint64_t(dev_.index) * 1000003u + uint64_t(index))));
        }
        worker_ = std::thread([this] { run(); });
    }
    ~CpuStream() override {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
        }
        cv_.notify_all();
        worker_.join();
    }

    int device_index() const override { return dev_.index; }
    int index() const override { return index_; }

    void launch(OpLabel label, std::function<void()> work) override {
        Item it;
        it.kind = Item::Work;
        it.label = std::move(label);
        it.fn = std::move(work);
        push(std::move(it));
    }

    void copy(void * dst, const void * src, size_t bytes, CopyKind kind, OpLabel label) override {
        dev_.mem.check_copy(dst, src, bytes, kind, label.name);
        Item it;
        it.kind = Item::Copy;
        it.label = std::move(label);
        it.dst = dst;
        it.src = src;
        it.bytes = bytes;
        it.copy_kind = kind;
        push(std::move(it));
    }

    void record(Event & ev) override {
        auto marker = std::make_shared<Marker>();
        as_cpu_event(ev, dev_.name).set_latest(marker);  // captured now, like cudaEventRecord
        Item it;
        it.kind = Item::Record;
        it.marker = std::move(marker);
        push(std::move(it));
    }

    void wait(Event & ev) override {
        auto marker = as_cpu_event(ev, dev_.name).latest();
        if (!marker) return;  // never recorded: a no-op, as in CUDA
        Item it;
        it.kind = Item::Wait;
        it.marker = std::move(marker);
        push(std::move(it));
    }

    void synchronize() override {
        auto marker = std::make_shared<Marker>();
        Item it;
        it.kind = Item::Record;
        it.marker = marker;
        push(std::move(it));
        marker->wait();
        std::lock_guard<std::mutex> lk(m_);
        if (error_) std::rethrow_exception(error_);
    }

private:
    struct Item {
        enum Kind { Work, Copy, Record, Wait } kind = Work;
        OpLabel label;
        std::function<void()> fn;
        void * dst = nullptr;
        const void * src = nullptr;
        size_t bytes = 0;
        CopyKind copy_kind = CopyKind::HostToHost;
        std::shared_ptr<Marker> marker;
    };

    void push(Item it) {
        {
            std::lock_guard<std::mutex> lk(m_);
            q_.push_back(std::move(it));
        }
        cv_.notify_one();
    }

    void run() {
        for (;;) {
            Item it;
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
                if (q_.empty()) return;  // stop requested and everything done
                it = std::move(q_.front());
                q_.pop_front();
            }
            inject_delay();
            execute(it);
        }
    }

    void inject_delay() {
        if (dev_.opt.delay_seed == 0 || dev_.opt.max_delay_us <= 0) return;
        std::uniform_real_distribution<double> dist(0.0, dev_.opt.max_delay_us);
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(dist(rng_)));
    }

    bool poisoned() {
        std::lock_guard<std::mutex> lk(m_);
        return error_ != nullptr;
    }

    void execute(Item & it) {
        switch (it.kind) {
        case Item::Record: it.marker->set(); return;
        case Item::Wait: it.marker->wait(); return;
        case Item::Work: {
            if (poisoned()) return;
            const double t0 = clock_us();
            try {
                if (auto f = dev_.fault(dev_.launches, dev_.opt.faults.launch_at, "launch", index_, it.label.name)) std::rethrow_exception(f);
                it.fn();
            } catch (...) {
                std::lock_guard<std::mutex> lk(m_);
                if (!error_) error_ = std::current_exception();
            }
            if (const double s = dev_.speed.load(); s < 1) {
                const double t1 = clock_us();
                std::this_thread::sleep_until(clock_time_point(t1 + (t1 - t0) * (1 / s - 1)));
            }
            report(it, t0, clock_us());
            return;
        }
        case Item::Copy: {
            if (poisoned()) return;
            if (auto f = dev_.fault(dev_.copies, dev_.opt.faults.copy_at, "copy", index_, it.label.name + ", " + std::to_string(it.bytes) + " bytes")) {
                std::lock_guard<std::mutex> lk(m_);
                if (!error_) error_ = f;
                return;
            }
            const double t0 = clock_us();
            Link * link = nullptr;
            if (dev_.opt.link && it.copy_kind == CopyKind::HostToDevice) link = &dev_.h2d;
            if (dev_.opt.link && it.copy_kind == CopyKind::DeviceToHost) link = &dev_.d2h;
            double end_us = 0;
            if (link) {
                std::lock_guard<std::mutex> lk(link->m);
                const double start = std::max(t0, link->free_at_us);
                end_us = start + dev_.opt.link->seconds(it.bytes) * 1e6;
                link->free_at_us = end_us;
            }
            if (it.bytes > 0) std::memmove(it.dst, it.src, it.bytes);
            if (link) std::this_thread::sleep_until(clock_time_point(end_us));
            report(it, t0, clock_us());
            return;
        }
        }
    }

    void report(const Item & it, double t0, double t1) {
        if (!dev_.opt.hook) return;
        OpRecord rec;
        rec.device = dev_.index;
        rec.stream = index_;
        rec.name = it.label.name;
        rec.cat = it.label.cat;
        rec.start_us = t0;
        rec.end_us = t1;
        rec.bytes = it.kind == Item::Copy ? it.bytes : 0;
        dev_.opt.hook(rec);
    }

    CpuDevice::Impl & dev_;
    int index_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<Item> q_;
    bool stop_ = false;
    std::exception_ptr error_;
    std::mt19937_64 rng_;
    std::thread worker_;  // last: starts after every other member exists
};

} // namespace

namespace {

std::string checked_name(int index, const CpuDeviceOptions & options) {
    if (options.num_streams < kNumStreamKinds) {
        throw Error("CPU device " + std::to_string(index) + ": " + std::to_string(options.num_streams) +
                    " streams requested, at least " + std::to_string(kNumStreamKinds) + " are needed");
    }
    if (options.max_delay_us < 0) throw Error("CPU device " + std::to_string(index) + ": negative max_delay_us");
    if (!(options.speed > 0 && options.speed <= 1))
        throw Error("CPU device " + std::to_string(index) + ": speed " + std::to_string(options.speed) + " is not in (0, 1]");
    return options.name.empty() ? "cpu:" + std::to_string(index) : options.name;
}

} // namespace

CpuDevice::CpuDevice(int index, CpuDeviceOptions options)
    : ArenaDevice(index, checked_name(index, options), options.memory_bytes) {
    const int n = options.num_streams;
    impl_ = std::make_unique<Impl>(index, name(), std::move(options), memory());
    for (int i = 0; i < n; ++i) streams_.push_back(std::make_unique<CpuStream>(*impl_, i));
    runner_ = std::make_unique<CpuGraphRunner>(this);
}

CpuDevice::~CpuDevice() {
    release();  // each stream finishes its queue, then joins its worker
}

void * CpuDevice::allocate(size_t bytes, const std::string & what) {
    if (auto f = impl_->fault(impl_->allocs, impl_->opt.faults.alloc_at, "allocation", -1, what + ", " + std::to_string(bytes) + " bytes"))
        std::rethrow_exception(f);
    return ArenaDevice::allocate(bytes, what);
}

void CpuDevice::set_speed(double speed) {
    if (!(speed > 0 && speed <= 1)) throw Error(name() + ": speed " + std::to_string(speed) + " is not in (0, 1]");
    impl_->speed = speed;
}

double CpuDevice::speed() const { return impl_->speed.load(); }

std::unique_ptr<Event> CpuDevice::create_event() { return std::make_unique<CpuEvent>(); }

void * CpuDevice::alloc_pinned(size_t bytes) {
    // Plain host memory: on the CPU device every host range is "pinned". Page-aligned like cudaHostAlloc.
    const size_t n = bytes == 0 ? 1 : bytes;
    void * p = host_alloc(n, name(), "pinned host memory");
    remember_pinned(p);
    return p;
}

void CpuDevice::free_pinned(void * ptr) {
    if (!ptr) return;
    forget_pinned(ptr);
    ::operator delete(ptr, std::align_val_t(4096));
}

void CpuDevice::register_host(void * ptr, size_t bytes, bool /*read_only: host memory is the device's*/) {
    std::lock_guard<std::mutex> lk(impl_->pinned_m);
    if (!impl_->registered.emplace(ptr, bytes).second) {
        throw Error(name() + ": host range registered twice");
    }
}

void CpuDevice::unregister_host(void * ptr) {
    std::lock_guard<std::mutex> lk(impl_->pinned_m);
    if (impl_->registered.erase(ptr) == 0) throw Error(name() + ": unregister of a host range that was not registered");
}

} // namespace rp
