// The host store (roundpipe/host_store.h) registers the frozen tensors' host bytes with the devices as whole
// pages (the copies to the GPU are then DMA from pinned memory, not staged through the driver's bounce
// buffer), counts what it could not register, and unregisters on destruction.
#include "tests/roundpipe/pipeline_util.h"

#include "ggml_rp/roundpipe/host_store.h"

#include <gtest/gtest.h>

#include <set>

using namespace rp_pipe_test;

TEST(HostStore, RegistersTheFrozenTensorsPagesAndUnregistersThem) {
    const Models & m = Models::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    rp::Trainer tr(*m.llama, cfg);
    rp::ModelProgram prog(tr);
    size_t frozen = 0;
    std::set<const void *> seen;  // a tensor two layers share (a tied head) counts once
    for (int l = 0; l < prog.num_layers(); ++l)
        for (const auto & ti : prog.layer_tensors(l))
            if (ti.param < 0 && seen.insert(ti.host).second) frozen += ti.bytes;
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
