// An SVG timeline of a trace: one row per (device, stream), time left to right, one box per operation
// coloured by its category "<pass>/<stage>": the pass picks the hue (fwd blue, fused purple, bwd orange,
// recompute yellow, optimizer green, anything else grey), the stage number the shade; copies are drawn
// lighter than kernels. Every box has a tooltip (<title>) with name, category, start and duration.
#pragma once

#include "ggml_rp/roundpipe/trace.h"

#include <string>

namespace rp {

struct TimelineOptions {
    int width = 1600;       // pixels of the time axis
    int row_height = 18;
    std::string title;      // drawn at the top when not empty
};

std::string timeline_svg(const Trace & trace, const TimelineOptions & options = {});

} // namespace rp
