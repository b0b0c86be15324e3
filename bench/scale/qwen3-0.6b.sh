#!/usr/bin/env bash
# Scale-out on one machine (issue 12's benchmark): LoRA steps of a Qwen3-0.6B-shaped bf16 model (the real shape
# and 151,936-token vocabulary, random weights written by rp-gguf synth; 1.2 GB, not shipped) on the host and
# through the RoundPipe runtime on 2 and 4 CPU virtual devices of a quarter of the model's bytes (or the least any
# plan takes, if that is more: before the vocabulary could stay on the host, the tied head alone was);
# then the max-sequence table against the RoundPipe paper, predicted for one 24 GiB device.
#
#   bench/scale/qwen3-0.6b.sh BUILD_DIR [THREADS]
#   env: SEQ (256), BATCH (2), STEPS (3), WORK (scratch dir, a fresh temp dir)
#
# Per run: tokens/s of the steady steps (rp-finetune's own per-step figures, the first step dropped), peak RSS
# (/usr/bin/time, the whole process), and per device the arena high-water against the planned peak
# (rp-finetune prints both). All runs are in one invocation: compare them with each other only (the machine
# is shared and its CPU model changes between sessions).
#
# Last measured 2026-12-01 (2-core Intel Xeon with AVX-512, load ~1.1), THREADS=2, defaults otherwise:
#   model 1,198,177,952 bytes; a quarter is 299,544,488 but the least plan takes 666,427,392 (0.556 of the
#   model: 2 x 296.75 MiB weight slots for the tied head + 6 MiB activations + 36 MiB graph), so devices of that
#   host   55.0 tok/s  peak RSS 1.46 GiB
#   2 dev  27.5 tok/s  peak RSS 2.78 GiB   high-water 666,427,392 = planned on both devices
#   4 dev  26.0 tok/s  peak RSS 3.25 GiB   high-water 666,427,392 = planned on all four
#   (the CPU devices share the same 2 cores and copy 2.6 GB of weights per step: no speed-up is expected here)
#   max seq, one 24 GiB device: qwen3-1.7b 199,164 (paper 73k: 2.73x), llama3.1-8b 119,990 (49k: 2.45x),
#   qwen3-32b 61,356 (28k: 2.19x) -- predicted with the CUDA memory rules, never measured on a GPU.
# Measured 2026-12-06 (2-core machine, load ~0.7-1.8), the embedding and head left on the host (--vocab-on-host auto):
#   the least plan takes 112,019,456 bytes (0.094 of the model), so devices of a quarter of it train:
#   host   126.5 tok/s  peak RSS 2.50 GiB
#   2 dev   44.0 tok/s  peak RSS 1.85 GiB   high-water 281,403,392: the first call's plan 281,401,344, a later
#   4 dev   44.0 tok/s  peak RSS 2.40 GiB     call's (measured layer times) carved 2 KiB more, on every device
#   max seq, one 24 GiB device: qwen3-1.7b 214,383 (2.94x), llama3.1-8b 131,557 (2.68x), qwen3-32b 68,071 (2.43x);
#   205,796 / 125,274 / 64,935 with --vocab-on-host off (on the host, the head crosses the link once per
#   micro-batch: 22-34 GiB a step at those lengths).
# 2026-12-07, the backward's nodes in the order its rules create them, activation gradients summed in place
# (ops/autodiff.h) and the graph allocator's offline placement (core/alloc.h): max seq qwen3-1.7b 238,744 (3.27x),
#   llama3.1-8b 147,439 (3.01x), qwen3-32b 78,131 (2.79x); 229,181 / 140,398 / 74,532 with --vocab-on-host off.
set -euo pipefail
build=${1:?usage: qwen3-0.6b.sh BUILD_DIR [THREADS]}
threads=${2:-2}
seq=${SEQ:-256}
batch=${BATCH:-2}
steps=${STEPS:-3}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
work=${WORK:-$(mktemp -d)}
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT
bin=$build/bin
model=$work/qwen3-0.6b-bf16.gguf
[ -f "$model" ] || "$bin/rp-gguf" synth "$model" --shape qwen3-0.6b --type bf16 --vocab "$shared/models/vocab/ggml-vocab-qwen2.gguf" >/dev/null
bytes=$(stat -c %s "$model")
quarter=$((bytes / 4))
# The devices get the larger of a quarter and the least any plan takes (rp-finetune --plan; with the tied head
# in both weight slots, 151936 x 1024 bf16 = 297 MiB each, that was more than a quarter).
least=$("$bin/rp-finetune" -m "$model" --plan --devices 2 --device-mem "$bytes" --seq-len "$seq" --batch "$batch" --lora-rank 8 |
        awk '/^device min peak:/ {print $4}')
mem=$(( least > quarter ? least : quarter ))
echo "model: $model, $bytes bytes; a quarter is $quarter, the least plan takes $least: devices of $mem bytes ($(awk -v m=$mem -v b=$bytes 'BEGIN {printf "%.3f", m/b}') of the model)"
echo "seq $seq, batch $batch, $steps steps, $threads threads; load $(cut -d' ' -f1-3 /proc/loadavg)"

run() {  # NAME EXTRA...
  local name=$1
  shift
  local log=$work/$name.log
  /usr/bin/time -f "rss_kib %M" "$bin/rp-finetune" -m "$model" --data "$shared/models/reference/train.txt" \
    -o "$work/$name.gguf" --seq-len "$seq" --batch "$batch" --steps "$steps" -t "$threads" --lora-rank 8 "$@" >"$log" 2>&1 || {
    echo "$name: failed"; tail -5 "$log"; return 0; }
  # steady tokens/s: the mean of the per-step figures after the first
  local tps
  tps=$(grep -E '^step [0-9]+/' "$log" | sed -E 's/.*\| ([0-9.]+) tok\/s.*/\1/' | tail -n +2 |
        awk '{s+=$1; n++} END {if (n) printf "%.1f", s/n; else print "n/a"}')
  local rss
  rss=$(awk '/^rss_kib/ {printf "%.2f", $2/1048576}' "$log")
  printf "%-10s  %8s tok/s  peak RSS %6s GiB\n" "$name" "$tps" "$rss"
  grep -E '^memory plan:|^memory cpu' "$log" | sed 's/^/    /' || true
}

run host
run 2dev --devices 2 --device-mem "$mem"
run 4dev --devices 4 --device-mem "$mem"

echo
echo "max sequence on one 24 GiB device (CUDA memory rules; bf16, LoRA r=32 on every linear layer, 1 sequence per micro-batch):"
"$bin/rp-simulate" --max-seq --all --device-mem 24G | grep -E '^(model|max seq|paper|token chunk|device peak)'
