#!/usr/bin/env bash
# The least host RAM and device memory of a LoRA run on the paper's models (RoundPipe on 8 x 24 GB CUDA devices,
# LoRA r32 on every linear layer, seq 4096, batch 8), planned by rp-finetune --plan on shapes-only files
# (rp-gguf synth --weights 0: every weight a hole, nothing read, no disk). bf16 and Q4_K_M bases (each tensor the type
# llama-quantize's Q4_K_M mix gives it: synth --type q4_k_m). Columns:
#   least: sync steps, the frozen weights registered in place (--pin register), the optimizer state in bf16;
#   bf16 checkpoints: least, and the boundary checkpoints in bf16 (--boundary-dtype bf16: every layer's output
#     rounded to bf16), with its device peak (the programs hold their input once more, in f32);
#   pinned copy: sync steps with a pinned copy of the frozen weights (what a GPU run takes when the host holds it)
#     and the fp32 optimizer state;
#   async: --async with the pinned copy (two calls' boundary checkpoints, the working copies and gradient slots).
# Prints a Markdown table.
# Usage: bench/roundpipe/host-memory-table.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}/bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1073741824 }'; }
echo "| model | base | least host RAM (GiB): sync, --pin register, --optimizer-state bf16 | and --boundary-dtype bf16 | sync, pinned copy | async, pinned copy | of which mapped weights | device peak (GiB, each of 8) | with bf16 boundaries |"
echo "|---|---|---|---|---|---|---|---|---|"
for shape in qwen3-1.7b llama3.1-8b qwen3-32b qwen3-235b-a22b; do
  for type in bf16 q4_k_m; do
    "$bin/rp-gguf" synth "$tmp/m.gguf" --shape "$shape" --weights 0 --type "$type" > /dev/null
    plan() { "$bin/rp-finetune" -m "$tmp/m.gguf" --plan --devices 8 --device-mem 24G --backend cuda --seq-len 4096 --batch 8 \
               --lora-rank 32 -o "$tmp/x.gguf" "$@" 2>&1; }
    out=$(plan --pin register --optimizer-state bf16) || { echo "| $shape | $type | does not fit: ${out##*error: } | | | | | | |"; continue; }
    peak() { sed -n 's/^host peak: \([0-9]*\) bytes.*/\1/p'; }
    least=$(peak <<< "$out")
    out16=$(plan --pin register --optimizer-state bf16 --boundary-dtype bf16)
    least16=$(peak <<< "$out16")
    copy=$(plan --pin alloc | peak)
    async=$(plan --pin alloc --async | peak)
    mapped=$(sed -n 's/^  mapped weights: \([0-9]*\) bytes.*/\1/p' <<< "$out")
    device=$(sed -n 's/^device peak: \([0-9]*\) bytes.*/\1/p' <<< "$out")
    device16=$(sed -n 's/^device peak: \([0-9]*\) bytes.*/\1/p' <<< "$out16")
    echo "| $shape | $type | $(gib "$least") | $(gib "$least16") | $(gib "$copy") | $(gib "$async") | $(gib "$mapped") | $(gib "$device") | $(gib "$device16") |"
    rm -f "$tmp/m.gguf"
  done
done
