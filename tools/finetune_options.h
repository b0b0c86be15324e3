// rp-finetune's options: each flag declared once against the field of rp::FinetuneJob it fills (the run file
// keys are the same names), and the library's field names as the flags, for its error messages.
#pragma once

#include "models/train/finetune_job.h"
#include "tools/options.h"

namespace rp::cli {

void declare_finetune_options(Options & opts, FinetuneJob & job);

// The library's parameter names as rp-finetune's flags (with_flag_names).
const FlagNames & finetune_flag_names();

} // namespace rp::cli
