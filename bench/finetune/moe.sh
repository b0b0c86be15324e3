#!/usr/bin/env bash
# Mixture of experts vs dense, side by side in one run: CPU training tokens/s of rp-finetune (LoRA and full)
# on a generated qwen3moe model and on a dense qwen3 with the same active parameters per token (n_ff of the
# dense = experts per token x each expert's n_ff), same attention, same data.
#
#   bench/finetune/moe.sh BUILD_DIR [THREADS]
#   env: EXPERTS (16), USED (2), EXPERT_FF (256), EMBD (256), LAYERS (4), SEQ (256), BATCH (4), STEPS (6)
#
# The MoE holds EXPERTS / USED times the dense model's feed-forward weights but computes the same FLOPs per
# token; the ratio shows what routing (top-k, gathering tokens per expert, one GEMM per expert) costs.
set -euo pipefail
build=${1:?usage: moe.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
experts=${EXPERTS:-16} used=${USED:-2} eff=${EXPERT_FF:-256} embd=${EMBD:-256} layers=${LAYERS:-4}
seq=${SEQ:-256} batch=${BATCH:-4} steps=${STEPS:-6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--vocab "$shared/models/stories260K.gguf" --n-embd "$embd" --n-head 8 --n-head-kv 4 --head-dim 32 --n-layer "$layers")
"$build/bin/rp-gguf" synth "$tmp/moe.gguf" "${common[@]}" --arch qwen3moe --experts "$experts" --experts-used "$used" \
  --expert-ff "$eff" --n-ff $((eff * used)) > "$tmp/moe.params"
"$build/bin/rp-gguf" synth "$tmp/dense.gguf" "${common[@]}" --arch qwen3 --n-ff $((eff * used)) > "$tmp/dense.params"
echo "== MoE ($experts experts, top $used, expert n_ff $eff; $(cat "$tmp/moe.params")) vs dense qwen3 (n_ff $((eff * used)); $(cat "$tmp/dense.params")):" \
     "n_embd $embd, $layers layers, seq $seq, batch $batch, $steps steps, $threads threads"
for mode in "" "--full"; do
  for m in moe dense; do
    line=$("$build/bin/rp-finetune" -m "$tmp/$m.gguf" --data "$shared/models/reference/train.txt" -o "$tmp/out.gguf" \
      --seq-len "$seq" --batch "$batch" --steps "$steps" --lr 1e-3 -t "$threads" $mode 2>&1 | grep '^done')
    printf '%-5s %-5s %s\n' "${mode:---lora}" "$m" "$line"
    sed -n 's/^done: .* s, \([0-9]*\) tok\/s.*/\1/p' <<<"$line" > "$tmp/$m${mode}.tps"
  done
  awk -v a="$(cat "$tmp/moe${mode}.tps")" -v b="$(cat "$tmp/dense${mode}.tps")" -v m="${mode:---lora}" \
    'BEGIN { printf "%s: MoE / dense tokens/s = %.2f\n", m, a / b }'
done
