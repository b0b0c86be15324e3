// The loss curve of a finetune run as a small hand-written SVG (train loss per step, validation loss at
// its evaluation steps), written to a temporary file and renamed.
#pragma once

#include "models/checkpoint.h"

#include <string>

namespace rp {

void write_loss_svg(const std::string & path, const TrainCurve & curve);

} // namespace rp
