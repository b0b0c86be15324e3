#include "models/check/max_seq.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "base/temp_dir.h"
#include "ggml_rp/runtime/arena.h"
#include "models/arch/model.h"
#include "models/convert/synth_model.h"
#include "models/train/run_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace rp {

namespace {

struct PaperFigure {
    const char * model;
    int64_t tokens;  // RoundPipe on an RTX 4090
};
const PaperFigure kPaper[] = {{"qwen3-1.7b", 73000}, {"llama3.1-8b", 49000}, {"qwen3-32b", 28000}};

// The shapes are tens of GB of holes: refuse a file system that would write them out.
void require_sparse_files(const TempDir & dir) {
    const std::string probe_path = dir.file("probe");
    AtomicFile probe(probe_path);
    probe.hole(size_t(64) << 20);
    probe.write("x", 1);
    probe.commit();
    struct stat st {};
    const bool sparse = ::stat(probe_path.c_str(), &st) == 0 && static_cast<long long>(st.st_blocks) * 512 < (16LL << 20);
    std::remove(probe_path.c_str());
    if (!sparse) throw Error(dir.path() + ": this file system has no sparse files (the model shapes would be written out); set TMPDIR");
}

MaxSeqResult plan_one(const std::string & name, const MaxSeqOptions & o, const std::string & path) {
    MaxSeqResult r;
    r.model = name;
    for (const PaperFigure & p : kPaper)
        if (name == p.model) r.paper_max_seq = p.tokens;
    SynthSpec spec = synth_preset(name);
    spec.wtype = gguf::TensorType::BF16;
    spec.weights = false;
    write_synth_model(spec, path);
    auto model = Model::load(path);
    RunPlanOptions po;
    SessionOptions & so = po.session;
    so.finetune.lora_rank = o.lora_rank;
    so.finetune.lora_alpha = 2.0f * static_cast<float>(o.lora_rank);
    so.batch = so.micro_batches = std::max(2, o.micro_batches);  // one sequence per micro-batch
    so.pipelined = true;
    so.pipeline.async = true;  // the paper's setting: the next step's forward overlaps, two calls' checkpoints
    so.devices.count = o.devices;
    so.devices.memory_each = o.device_memory;
    so.devices.backend = "cuda";
    so.pipeline.vocab_on_host = o.vocab_on_host;
    po.seq_len = 1;
    po.max_seq_limit = 1 << 22;
    const RunPlan probe = plan_run(*model, po);
    r.weight_bytes = probe.host.mapped_weights;
    r.weight_types = spec.expert_wtype && *spec.expert_wtype != spec.wtype
                         ? std::string("bf16, experts ") + gguf::type_name(static_cast<uint32_t>(*spec.expert_wtype))
                         : std::string("bf16");
    r.micro_batches = static_cast<int>(so.micro_batches);
    r.max_seq = r.device_max_seq = probe.max_seq;
    po.max_seq_limit = 0;
    // At `seq`, the plan a run takes (rp-finetune: host_fitting_token_chunk), and whether it fits the host.
    auto host_fits = [&](int64_t seq) {
        po.seq_len = seq;
        po.session.pipeline.token_chunk = -1;
        if (o.host_memory == 0) return true;
        if (const int64_t chunk = host_fitting_token_chunk(*model, po, 0, o.host_memory); chunk > 0) po.session.pipeline.token_chunk = chunk;
        return plan_run(*model, po).host.total() <= o.host_memory;
    };
    // Host RAM: the host peak grows with the sequence (the boundary checkpoints of the calls in flight), so the
    // longest one that fits is found by bisection below the devices' maximum.
    if (o.host_memory > 0 && r.max_seq > 0 && !host_fits(r.max_seq)) {
        int64_t lo = 0, hi = r.max_seq;  // lo fits (0: nothing yet), hi does not
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            (host_fits(mid) ? lo : hi) = mid;
        }
        r.max_seq = lo;
    }
    if (r.max_seq > 0) {
        host_fits(r.max_seq);  // (its token chunk)
        const RunPlan at = plan_run(*model, po);
        r.host_peak = at.host.total();
        r.report = at.report();
    }
    return r;
}

} // namespace

std::vector<std::string> paper_max_seq_models() {
    std::vector<std::string> out;
    for (const PaperFigure & p : kPaper) out.push_back(p.model);
    return out;
}

std::vector<MaxSeqResult> plan_max_seq(const std::vector<std::string> & models, const MaxSeqOptions & options) {
    const TempDir scratch("rp-max-seq");
    require_sparse_files(scratch);
    const std::string path = scratch.file("shapes.gguf");
    std::vector<MaxSeqResult> out;
    for (const std::string & name : models) {
        try {
            out.push_back(plan_one(name, options, path));
        } catch (const std::exception & e) {
            MaxSeqResult r;
            r.model = name;
            r.error = e.what();
            out.push_back(r);
        }
        std::remove(path.c_str());
    }
    return out;
}

} // namespace rp
