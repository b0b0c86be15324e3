#!/usr/bin/env bash
# check_layers.sh must refuse an upward include, a sideways one and a file outside the layers, in ggml_rp/ and
# in models/, and pass the downward ones.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/models/text" "$tmp/models/convert" "$tmp/models/train" "$tmp/gguf" "$tmp/base" \
         "$tmp/ggml_rp/core" "$tmp/ggml_rp/ops" "$tmp/ggml_rp/runtime" "$tmp/ggml_rp/roundpipe"
expect_refused() {  # what: the case; then the tree is reset
  if out=$(bash "$here/check_layers.sh" "$tmp" 2>&1); then echo "FAIL: accepted $1"; exit 1; fi
  echo "$out" | grep -q "$2" || { echo "FAIL: $1: the message does not name $2: $out"; exit 1; }
  rm -f "$tmp"/models/*/*.h "$tmp"/models/*.h "$tmp"/ggml_rp/*/*.h "$tmp"/ggml_rp/*/*.cpp "$tmp"/gguf/*.h
}
echo '#include "models/train/session.h"' > "$tmp/models/text/tokenizer.h"
expect_refused "text including train" "models/text/tokenizer.h (text) includes models/train/session.h"
echo '#include "models/data/dataset.h"' > "$tmp/models/convert/quant_mix.h"
expect_refused "convert including data" "models/convert/quant_mix.h (convert) includes models/data/dataset.h"
echo '' > "$tmp/models/loose.h"
expect_refused "a file outside the rooms" "models/loose.h: outside the layers"
echo '#include "ggml_rp/cpu/kernel_registry.h"' > "$tmp/ggml_rp/ops/op_table.cpp"
expect_refused "ops including cpu" "ggml_rp/ops/op_table.cpp (ops) includes ggml_rp/cpu/kernel_registry.h"
echo '#include "ggml_rp/ops/op_table.h"' > "$tmp/ggml_rp/core/tensor.h"
expect_refused "core including ops" "ggml_rp/core/tensor.h (core) includes ggml_rp/ops/op_table.h"
echo '#include "ggml_rp/cuda/backend_plan.h"' > "$tmp/ggml_rp/runtime/graph_runner.h"
expect_refused "runtime including cuda" "ggml_rp/runtime/graph_runner.h (runtime) includes ggml_rp/cuda/backend_plan.h"
echo '#include "ggml_rp/cuda/cuda_device.h"' > "$tmp/ggml_rp/roundpipe/plan.h"
expect_refused "roundpipe including more of cuda than its host rules" "ggml_rp/roundpipe/plan.h (roundpipe) includes ggml_rp/cuda/cuda_device.h"
mkdir -p "$tmp/ggml_rp/loose" && echo '' > "$tmp/ggml_rp/loose/x.h"
expect_refused "a folder of ggml_rp that is no layer" "ggml_rp/loose/x.h: outside the layers"
rm -rf "$tmp/ggml_rp/loose"
echo '#include "ggml_rp/core/tensor.h"' > "$tmp/gguf/reader.h"
expect_refused "gguf including the engine" "include ggml_rp/"
echo '#include "models/text/unicode.h"' > "$tmp/models/train/ok.h"
echo '#include "ggml_rp/core/tensor.h"' > "$tmp/ggml_rp/runtime/ok.h"
echo '#include "ggml_rp/cuda/backend_plan.h"' > "$tmp/ggml_rp/roundpipe/ok.h"
bash "$here/check_layers.sh" "$tmp" >/dev/null || { echo "FAIL: refused a downward include"; exit 1; }
echo "ok: upward, sideways and layerless files are refused; downward includes pass"
