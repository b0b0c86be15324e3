#!/usr/bin/env bash
# GRPO's step on the CPU: how fast the rollouts sample (tokens/s, the prompt evaluations not counted), how fast the
# rest of the step trains (the sequences' tokens/s outside the rollouts), and the share of the step spent sampling.
# stories260K and, with SHAPE=qwen3-0.6b, a generated model of that shape (random weights: the cost, not the
# learning), side by side in one run; each with the group's completions decoded one at a time (--rollout-batch 1)
# and all together (the default), and with each --rollout-matvec (fast: row dots, the default; exact).
#
#   bench/finetune/grpo.sh BUILD_DIR [THREADS]
#   env: SHAPES ("stories260K qwen3-0.6b"), GROUP (8), PROMPTS (per step, 2), LEN (max completion, 32), STEPS (6),
#        ROLLOUT_BATCHES ("1 0": --rollout-batch values), MATVECS ("fast exact": --rollout-matvec values),
#        TYPE (the generated model's weights: bf16, or e.g. q4_k_m / q8_0 for a QLoRA base)
#
# Prints per model and rollout batch: the mean over steps 2..STEPS of the rollout tokens/s, the training tokens/s
# and the rollout share, from the run's metrics JSONL.
set -euo pipefail
build=${1:?usage: grpo.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
shapes=${SHAPES:-"stories260K qwen3-0.6b"}
group=${GROUP:-8}
prompts=${PROMPTS:-2}
len=${LEN:-32}
steps=${STEPS:-6}
rollout_batches=${ROLLOUT_BATCHES:-"1 0"}
matvecs=${MATVECS:-"fast exact"}
type=${TYPE:-bf16}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for i in $(seq 0 15); do
  echo "{\"prompt\": \"Once upon a time, there was a little girl who liked to play in the park with her dog. One day she $i\"}"
done > "$tmp/prompts.jsonl"

echo "== GRPO on the CPU: $prompts prompts x $group completions of up to $len tokens per step, $steps steps, $threads threads"
printf "%-14s %8s %8s %14s %14s %10s\n" model decoded matvec rollout_tok/s train_tok/s rollout%
for shape in $shapes; do
  if [ "$shape" = stories260K ]; then
    model=$shared/models/stories260K.gguf
  else
    model=$tmp/$shape.gguf
    if [ "$type" = bf16 ] || [ "$type" = f32 ]; then
      "$build/bin/rp-gguf" synth "$model" --shape "$shape" --type "$type" --vocab "$shared/models/vocab/ggml-vocab-qwen2.gguf" > /dev/null
    else  # random bf16 weights quantized as llama-quantize would
      "$build/bin/rp-gguf" synth "$tmp/base.gguf" --shape "$shape" --type bf16 --vocab "$shared/models/vocab/ggml-vocab-qwen2.gguf" > /dev/null
      "$build/bin/rp-gguf" convert "$tmp/base.gguf" "$model" --type "$type" > /dev/null
      rm -f "$tmp/base.gguf"
    fi
  fi
  for rb in $rollout_batches; do
  for mv in $matvecs; do
    "$build/bin/rp-finetune" -m "$model" --data "$tmp/prompts.jsonl" --method grpo --reward regex:dog --group "$group" \
      --max-completion-len "$len" --batch "$prompts" --steps "$steps" -t "$threads" --lr 1e-4 --rollout-batch "$rb" \
      --rollout-matvec "$mv" -o "$tmp/out.gguf" > "$tmp/$shape.log" 2>&1 ||
      { cat "$tmp/$shape.log" >&2; exit 1; }
    # per step: tokens_per_s (the whole step's sequence tokens / s), rollout_seconds, rollout_tokens_per_s; the step's
    # seconds from its sequence tokens (n_seq x seq_len, from the setup line) / tokens_per_s
    seqtok=$(sed -n 's/.*(sequences of \([0-9]*\)).*/\1/p' "$tmp/$shape.log")
    together=$rb; [ "$rb" = 0 ] && together=$group
    awk -v n="$((prompts * group))" -v T="$seqtok" -v name="$shape" -v together="$together" -v mv="$mv" '
      /"rollout_seconds"/ {
        match($0, /"step":[0-9]+/); step = substr($0, RSTART + 7, RLENGTH - 7) + 0
        if (step < 2) next
        match($0, /"tokens_per_s":[0-9.]+/); tps = substr($0, RSTART + 15, RLENGTH - 15) + 0
        match($0, /"rollout_seconds":[0-9.]+/); rs = substr($0, RSTART + 18, RLENGTH - 18) + 0
        match($0, /"rollout_tokens_per_s":[0-9.]+/); rtps = substr($0, RSTART + 23, RLENGTH - 23) + 0
        secs = n * T / tps
        r += rtps; t += n * T / (secs - rs); share += rs / secs; k++
      }
      END { if (k) printf "%-14s %8s %8s %14.0f %14.0f %9.0f%%\n", name, together, mv, r / k, t / k, 100 * share / k }' "$tmp/out.gguf.metrics.jsonl"
  done
  done
done
