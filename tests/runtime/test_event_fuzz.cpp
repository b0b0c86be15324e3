// Race fuzzing of the event protocol the RoundPipe dispatcher uses (roundpipe.md §8, §9.2, §9.3, §16):
// a chain of 7 stages over 5 micro-batches on 4 CPU virtual devices (stage s on device s mod 4, one host
// thread per device as the device-controller threads), with random delays injected before every stream
// operation, and the result compared bit for bit with a plain sequential run.
//
// The protocol under test, per stage job:
//   - weights: H2D on the weight stream, compute waits on its event;
//   - micro-batch i: the device thread acquires the producer stage's counting semaphore (the producer
//     released it after RECORDING its output event, so the wait below is never a silent no-op), the
//     activation stream waits that event and uploads through pinned host memory;
//   - two input and two output slots reused every other micro-batch, each reuse gated by an event proving
//     the last reader finished (the input slot by the compute of i-2, the output slot by the D2H of i-2);
//   - grads accumulate on the device in micro-batch order and go D2H after the last one;
//   - device memory is freed only after the host synchronised the job's last event.
// Any missing edge shows up as a wrong bit (or as a data race under ThreadSanitizer).
#include "ggml_rp/runtime/cpu_device.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <semaphore>
#include <thread>
#include <vector>

using rp::CopyKind;
using rp::CpuDevice;
using rp::StreamKind;

namespace {

constexpr int kDevices = 4, kStages = 7, kMicro = 5, kN = 256;
constexpr size_t kBytes = kN * sizeof(float);

// The stage function and the accumulation, used by both the devices and the reference (never inlined, so
// both run the very same machine code).
[[gnu::noinline]] void apply_stage(const float * in, const float * w, float * out) {
    for (int k = 0; k < kN; ++k) out[k] = std::tanh(in[k] * w[k] + 0.25f * in[(k + 1) % kN]);
}
[[gnu::noinline]] void accumulate(float * acc, const float * y) {
    for (int k = 0; k < kN; ++k) acc[k] += y[k];
}

struct Data {
    std::vector<std::vector<float>> input, weights;  // [mb][k], [stage][k]
    Data() {
        input.assign(kMicro, std::vector<float>(kN));
        weights.assign(kStages, std::vector<float>(kN));
        for (int i = 0; i < kMicro; ++i)
            for (int k = 0; k < kN; ++k) input[i][k] = std::sin(0.37f * k + 1.3f * i);
        for (int s = 0; s < kStages; ++s)
            for (int k = 0; k < kN; ++k) weights[s][k] = 0.5f + 0.9f * std::cos(0.11f * k * (s + 1));
    }
};

struct Result {
    std::vector<std::vector<float>> out;  // last stage, per micro-batch
    std::vector<std::vector<float>> acc;  // per stage
};

Result sequential(const Data & d) {
    Result r;
    r.acc.assign(kStages, std::vector<float>(kN, 0.0f));
    r.out.assign(kMicro, std::vector<float>(kN));
    for (int i = 0; i < kMicro; ++i) {
        std::vector<float> x = d.input[i], y(kN);
        for (int s = 0; s < kStages; ++s) {
            apply_stage(x.data(), d.weights[s].data(), y.data());
            x = y;
        }
        r.out[i] = x;
    }
    // accumulation order: per stage, micro-batches 0..M-1 (what the devices do)
    for (int s = 0; s < kStages; ++s) {
        for (int i = 0; i < kMicro; ++i) {
            std::vector<float> x = d.input[i], y(kN);
            for (int t = 0; t <= s; ++t) {
                apply_stage(x.data(), d.weights[t].data(), y.data());
                x = y;
            }
            accumulate(r.acc[s].data(), x.data());
        }
    }
    return r;
}

Result pipelined(const Data & d, uint64_t seed, double max_delay_us) {
    std::vector<std::unique_ptr<CpuDevice>> dev;
    for (int g = 0; g < kDevices; ++g) {
        rp::CpuDeviceOptions o;
        o.memory_bytes = 64 << 10;
        o.delay_seed = seed * kDevices + static_cast<uint64_t>(g) + 1;
        o.max_delay_us = max_delay_us;
        dev.push_back(std::make_unique<CpuDevice>(g, o));
    }
    CpuDevice & host_dev = *dev[0];
    // pinned host buffers: inputs, weights, every stage's output per micro-batch, grads
    std::vector<rp::PinnedBuffer> h_in, h_w, h_acc;
    std::vector<std::vector<rp::PinnedBuffer>> h_act(kStages);
    for (int i = 0; i < kMicro; ++i) {
        h_in.emplace_back(host_dev, kBytes);
        std::memcpy(h_in.back().data(), d.input[i].data(), kBytes);
    }
    for (int s = 0; s < kStages; ++s) {
        h_w.emplace_back(host_dev, kBytes);
        std::memcpy(h_w.back().data(), d.weights[s].data(), kBytes);
        h_acc.emplace_back(host_dev, kBytes);
        for (int i = 0; i < kMicro; ++i) h_act[s].emplace_back(host_dev, kBytes);
    }
    // events, each created by the device that records it
    std::vector<std::vector<std::unique_ptr<rp::Event>>> out_ev(kStages), comp_ev(kStages), in_ev(kStages);
    std::vector<std::unique_ptr<rp::Event>> w_ev, done_ev;
    for (int s = 0; s < kStages; ++s) {
        CpuDevice & owner = *dev[s % kDevices];
        w_ev.push_back(owner.create_event());
        done_ev.push_back(owner.create_event());
        for (int i = 0; i < kMicro; ++i) {
            out_ev[s].push_back(owner.create_event());
            comp_ev[s].push_back(owner.create_event());
            in_ev[s].push_back(owner.create_event());
        }
    }
    std::vector<std::unique_ptr<std::counting_semaphore<kMicro>>> sem;
    for (int s = 0; s < kStages; ++s) sem.push_back(std::make_unique<std::counting_semaphore<kMicro>>(0));

    auto run_job = [&](int s) {
        CpuDevice & g = *dev[s % kDevices];
        rp::Stream & wup = g.stream(StreamKind::WeightUpload);
        rp::Stream & up = g.stream(StreamKind::ActivationUpload);
        rp::Stream & comp = g.stream(StreamKind::Compute);
        rp::Stream & down = g.stream(StreamKind::Download);
        std::string st = "S";
        st += std::to_string(s);
        auto * w = static_cast<float *>(g.allocate(kBytes, st + " weights"));
        auto * acc = static_cast<float *>(g.allocate(kBytes, st + " grads"));
        float * in[2] = {static_cast<float *>(g.allocate(kBytes, st + " in0")),
                         static_cast<float *>(g.allocate(kBytes, st + " in1"))};
        float * out[2] = {static_cast<float *>(g.allocate(kBytes, st + " out0")),
                          static_cast<float *>(g.allocate(kBytes, st + " out1"))};

        wup.copy(w, h_w[s].data(), kBytes, CopyKind::HostToDevice, st + " weights");
        wup.record(*w_ev[s]);
        comp.wait(*w_ev[s]);
        comp.launch(st + " zero grads", [acc] { std::memset(acc, 0, kBytes); });
        for (int i = 0; i < kMicro; ++i) {
            const int slot = i % 2;
            if (s > 0) sem[s - 1]->acquire();  // the producer has recorded out_ev[s-1][i]
            if (i >= 2) up.wait(*comp_ev[s][i - 2]);  // input slot free again
            if (s > 0) {
                up.wait(*out_ev[s - 1][i]);
                up.copy(in[slot], h_act[s - 1][i].data(), kBytes, CopyKind::HostToDevice, st + " in");
            } else {
                up.copy(in[slot], h_in[i].data(), kBytes, CopyKind::HostToDevice, st + " in");
            }
            up.record(*in_ev[s][i]);
            comp.wait(*in_ev[s][i]);
            if (i >= 2) comp.wait(*out_ev[s][i - 2]);  // output slot downloaded
            float * x = in[slot];
            float * y = out[slot];
            comp.launch(st + " compute", [x, y, w, acc] {
                apply_stage(x, w, y);
                accumulate(acc, y);
            });
            comp.record(*comp_ev[s][i]);
            down.wait(*comp_ev[s][i]);
            down.copy(h_act[s][i].data(), y, kBytes, CopyKind::DeviceToHost, st + " out");
            down.record(*out_ev[s][i]);
            sem[s]->release();
        }
        down.copy(h_acc[s].data(), acc, kBytes, CopyKind::DeviceToHost, st + " grads");
        down.record(*done_ev[s]);
        done_ev[s]->synchronize();  // the job's last reader has finished: the memory may go
        for (void * p : {static_cast<void *>(w), static_cast<void *>(acc), static_cast<void *>(in[0]),
                         static_cast<void *>(in[1]), static_cast<void *>(out[0]), static_cast<void *>(out[1])}) {
            g.free(p);
        }
    };

    std::vector<std::thread> threads;
    for (int g = 0; g < kDevices; ++g) {
        threads.emplace_back([&, g] {
            for (int s = g; s < kStages; s += kDevices) run_job(s);
        });
    }
    for (auto & t : threads) t.join();
    for (auto & g : dev) g->synchronize();

    Result r;
    for (int i = 0; i < kMicro; ++i) {
        const float * p = h_act[kStages - 1][i].as<float>();
        r.out.emplace_back(p, p + kN);
    }
    for (int s = 0; s < kStages; ++s) r.acc.emplace_back(h_acc[s].as<float>(), h_acc[s].as<float>() + kN);
    for (auto & g : dev) EXPECT_EQ(g->used(), 0u);
    return r;
}

bool bit_equal(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST(EventFuzz, ChainAcrossFourDevicesIsBitIdenticalToSequentialOver200Seeds) {
    const Data d;
    const Result ref = sequential(d);
    for (uint64_t seed = 1; seed <= 200; ++seed) {
        const Result got = pipelined(d, seed, 40.0);
        for (int i = 0; i < kMicro; ++i) ASSERT_TRUE(bit_equal(got.out[i], ref.out[i])) << "seed " << seed << " mb " << i;
        for (int s = 0; s < kStages; ++s) ASSERT_TRUE(bit_equal(got.acc[s], ref.acc[s])) << "seed " << seed << " stage " << s;
    }
}
