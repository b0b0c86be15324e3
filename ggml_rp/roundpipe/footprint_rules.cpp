#include "ggml_rp/roundpipe/footprint_rules.h"

#include "base/error.h"
#include "ggml_rp/cuda/backend_plan.h"

namespace rp {

namespace {

class CudaFootprintRules final : public GraphRunner {
public:
    size_t run(Graph &, int, const std::function<void()> &) override { throw Error("footprint rules cannot run a graph"); }
    void copy_out(void *, const Tensor *) override { throw Error("footprint rules cannot copy"); }
    void zero(void *, size_t) override { throw Error("footprint rules cannot write memory"); }
    void * upload(const void *, size_t) override { throw Error("footprint rules cannot upload"); }
    void * hold(size_t) override { throw Error("footprint rules cannot hold memory"); }
    void release_held() override {}
    size_t graph_bytes(const Graph & g) const override { return cuda::cuda_graph_bytes(g).total(); }
    size_t upload_bytes(size_t bytes) const override { return cuda::align256(bytes); }
    void set_region(void *, size_t) override {}
    size_t region_high_water() const override { return 0; }
};

} // namespace

std::unique_ptr<GraphRunner> footprint_rules(const std::string & backend) {
    if (backend == "cpu") return std::make_unique<CpuGraphRunner>();
    if (backend == "cuda") return std::make_unique<CudaFootprintRules>();
    throw Error("footprint rules: unknown backend '" + backend + "' (cpu or cuda)");
}

} // namespace rp
