// Every op of ggml-rp (one header per family).
#pragma once

#include "ggml_rp/ops/attention.h"
#include "ggml_rp/ops/binary.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/cross_entropy.h"
#include "ggml_rp/ops/dropout.h"
#include "ggml_rp/ops/get_rows.h"
#include "ggml_rp/ops/lora.h"
#include "ggml_rp/ops/moe.h"
#include "ggml_rp/ops/mul_mat.h"
#include "ggml_rp/ops/norm.h"
#include "ggml_rp/ops/preference_loss.h"
#include "ggml_rp/ops/reduce.h"
#include "ggml_rp/ops/rope.h"
#include "ggml_rp/ops/softmax.h"
#include "ggml_rp/ops/unary.h"
#include "ggml_rp/ops/view.h"
