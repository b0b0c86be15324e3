#!/usr/bin/env bash
# The README's main job: build, LoRA-finetune the bundled stories260K model on a small sample text, then
# generate with the adapter. Outputs go to out/ (the adapter, its metrics log and loss curve SVG).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
DATA=${DATA:-examples/data/stories.txt}
OUT=${OUT:-out}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target rp-finetune rp-generate rp-gguf
mkdir -p "$OUT"
"$BUILD_DIR"/bin/rp-gguf info "$MODEL" | sed -n 1,4p
"$BUILD_DIR"/bin/rp-finetune -m "$MODEL" --data "$DATA" -o "$OUT/stories260K-lora.gguf" \
  --lora-rank 8 --lora-alpha 16 --seq-len 64 --batch 8 --steps ${STEPS:-40} --lr 3e-3 --warmup 2 \
  --lr-schedule cosine --val-split 0.1 --eval-every 4 --early-stop 2 --save-best --seed 5
# The sample text is 3 KB: the adapter soon memorises it and the validation loss turns up again; --early-stop
# ends the run then, and --save-best has kept the adapter of the best validation loss.
echo "== the base model:"
"$BUILD_DIR"/bin/rp-generate -m "$MODEL" -p "Once upon a time" -n 48 --temp 0
echo
echo "== with the adapter:"
"$BUILD_DIR"/bin/rp-generate -m "$MODEL" --lora "$OUT/stories260K-lora.gguf.best.gguf" -p "Once upon a time" -n 48 --temp 0
echo
echo "adapter: $OUT/stories260K-lora.gguf.best.gguf (best validation; the last step's: $OUT/stories260K-lora.gguf); loss curve: $OUT/stories260K-lora.gguf.loss.svg"
