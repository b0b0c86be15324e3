#!/usr/bin/env bash
# The README's main job. Until finetuning lands this builds the tools and inspects the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRP_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target rp-gguf
"$BUILD_DIR"/bin/rp-gguf info "$MODEL"
