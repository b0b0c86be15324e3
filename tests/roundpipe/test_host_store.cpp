// The host store (roundpipe/host_store.h) pins the frozen tensors' host bytes (the copies to the GPU are then
// DMA from pinned memory, not staged through the driver's bounce buffer) in the three ways of FrozenPinning:
// registered with the devices as whole pages (what it could not register counted, everything unregistered on
// destruction), copied into pinned buffers, or left pageable.
#include "tests/roundpipe/pipeline_util.h"

#include "ggml_rp/roundpipe/host_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>

using namespace rp_pipe_test;

namespace {

// The frozen tensors' bytes of prog, a tensor two layers share (a tied head) counted once.
size_t frozen_bytes(const rp::TrainingProgram & prog) {
    size_t frozen = 0;
    std::set<const void *> seen;
    for (int l = 0; l < prog.num_layers(); ++l)
        for (const auto & ti : prog.layer_tensors(l))
            if (ti.param < 0 && ti.bytes > 0 && seen.insert(ti.host).second) frozen += ti.bytes;
    return frozen;
}

} // namespace

TEST(HostStore, RegistersTheFrozenTensorsPagesAndUnregistersThem) {
    const Models & m = Models::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    rp::Trainer tr(*m.llama, cfg);
    rp::TrainingProgram & prog = tr;
    const size_t frozen = frozen_bytes(prog);
    ASSERT_GT(frozen, 0u);
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    {
        rp::HostStore a(prog, dev);
        EXPECT_GE(a.frozen_registered_bytes(), frozen);  // whole pages: at least the bytes
        EXPECT_EQ(a.frozen_registered_bytes() % 4096, 0u);
        EXPECT_EQ(a.frozen_pageable_bytes(), 0u);
        // The same ranges again while they are registered: the device refuses, the store copies from pageable
        // memory instead (the same bytes, slower) and says so.
        rp::HostStore b(prog, dev);
        EXPECT_EQ(b.frozen_registered_bytes(), 0u);
        EXPECT_EQ(b.frozen_pageable_bytes(), a.frozen_registered_bytes());
    }
    rp::HostStore c(prog, dev);  // a and b unregistered what they had registered
    EXPECT_GE(c.frozen_registered_bytes(), frozen);
    EXPECT_EQ(c.frozen_pageable_bytes(), 0u);
}

// Copy ("alloc"): every frozen tensor uploads from a 256-byte aligned pinned copy of its bytes, a tensor two
// layers share (qwen3's tied embedding and head) from one copy; nothing is registered or left pageable.
// Off: the uploads read the program's own bytes.
TEST(HostStore, CopiesTheFrozenTensorsIntoPinnedBuffersOrLeavesThemPageable) {
    const Models & m = Models::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    rp::Trainer tr(*m.qwen3, cfg);
    rp::TrainingProgram & prog = tr;
    const size_t frozen = frozen_bytes(prog);
    ASSERT_GT(frozen, 0u);
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    rp::HostStore copy(prog, dev, rp::FrozenPinning::Copy);
    EXPECT_EQ(copy.frozen_pinning().mode, rp::FrozenPinning::Copy);
    EXPECT_EQ(copy.frozen_pinning().copied, frozen);
    EXPECT_EQ(copy.frozen_pinning().registered, 0u);
    EXPECT_EQ(copy.frozen_pinning().pageable, 0u);
    EXPECT_NE(copy.frozen_pinning().describe().find("copied into pinned memory"), std::string::npos) << copy.frozen_pinning().describe();
    rp::HostStore off(prog, dev, rp::FrozenPinning::Pageable);
    EXPECT_EQ(off.frozen_pinning().pageable, frozen);
    EXPECT_EQ(off.frozen_pinning().copied + off.frozen_pinning().registered, 0u);
    std::map<const void *, const void *> copy_of;  // the program's bytes -> the copy they upload from
    int shared = 0;
    for (int l = 0; l < prog.num_layers(); ++l) {
        const auto & ts = prog.layer_tensors(l);
        for (size_t i = 0; i < ts.size(); ++i) {
            if (ts[i].param >= 0) continue;
            const void * src = copy.upload_source(l, static_cast<int>(i));
            EXPECT_NE(src, ts[i].host) << ts[i].name;
            EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % 256, 0u) << ts[i].name;
            EXPECT_EQ(std::memcmp(src, ts[i].host, ts[i].bytes), 0) << ts[i].name;
            EXPECT_EQ(off.upload_source(l, static_cast<int>(i)), ts[i].host) << ts[i].name;
            const auto [it, fresh] = copy_of.emplace(ts[i].host, src);
            if (!fresh) {
                EXPECT_EQ(it->second, src) << ts[i].name << " is copied twice";
                ++shared;
            }
        }
    }
    EXPECT_GE(shared, 1);  // the tied embedding
}
