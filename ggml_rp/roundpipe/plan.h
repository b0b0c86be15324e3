// An execute plan as data (roundpipe.md §2, §3.3): which layers each stage holds.
//
// Layers 0 .. L-1 are the model's sequential view (the model library decides what each layer is; the last
// one ends in the loss). A plan for fused training is
//   fwd = [F0, F1, ... F(f-1)]  ascending ranges covering [0, e)          forward only, no autograd state
//   bwd = [FB, B1, ... B(b-1)]  FB = [e, L): the fused tail (forward, loss, backward per micro-batch, never
//                               recomputed); B1 ... descending ranges covering [0, e)   (recompute + backward)
// so the last forward layer + 1 is the first layer of FB. Forward and backward stages differ in size.
#pragma once

#include <string>
#include <vector>

namespace rp {

struct LayerRange {
    int begin = 0;  // first layer
    int end = 0;    // one past the last layer
    int size() const { return end - begin; }
    bool operator==(const LayerRange &) const = default;
};

// What a backward job re-runs: the whole stage then one backward over it (checkpoint = the stage input,
// faster, more memory), or one layer at a time (checkpoint = every layer input; less memory, more H2D).
enum class RecomputeGrain { Stage, Layer };

struct Plan {
    std::vector<LayerRange> fwd;
    std::vector<LayerRange> bwd;  // bwd[0] is the fused tail
    RecomputeGrain grain = RecomputeGrain::Stage;
    double stage_bound = 0;          // T the planner chose (0 for a plan given by hand)
    double cost = 0;                 // max(S, min_stages) * T
    std::vector<std::string> notes;  // planner warnings, e.g. a raised memory limit

    int num_layers() const { return bwd.empty() ? 0 : bwd.front().end; }
    int fb_begin() const { return bwd.empty() ? 0 : bwd.front().begin; }
    int num_stages() const { return static_cast<int>(fwd.size() + bwd.size()); }
    // "F [0,8) [8,17) | FB [29,30) | B [26,29) ... [0,2)"
    std::string describe() const;
    bool operator==(const Plan & o) const { return fwd == o.fwd && bwd == o.bwd && grain == o.grain; }
};

// Checks roundpipe.md §11.3 step 5: forward ranges non-empty, ascending and covering [0, e); backward
// ranges non-empty, FB = [e, num_layers), the rest descending and covering [0, e). Throws rp::Error saying
// which stage is wrong.
void validate_plan(const Plan & plan, int num_layers);

// A plan from stage sizes in layers: fwd sizes shallow -> deep, bwd sizes FB first then deep -> shallow
// (the order of roundpipe.md §11.4). Validated.
Plan plan_from_sizes(const std::vector<int> & fwd_sizes, const std::vector<int> & bwd_sizes,
                     RecomputeGrain grain = RecomputeGrain::Stage);

// The partitions of roundpipe.md §11.4 in decoder layers per stage: "F0,F1,...|FB,B1,B2,..." (backward
// stages deep -> shallow; "2x4" is four stages of 2). The prefix (embedding) rides in F0 and in the last
// backward stage, the postfix (norm, head, loss) in FB: a model of n decoder layers is planned over n + 2
// layers. Throws rp::Error naming the bad item.
Plan plan_from_decoder_counts(const std::string & text);
// The inverse: "7,7,7,7|0,3,3,3,3,3,3,3,3,2,2".
std::string decoder_counts(const Plan & plan);

} // namespace rp
