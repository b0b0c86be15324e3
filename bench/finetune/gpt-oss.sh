#!/usr/bin/env bash
# gpt-oss vs qwen3moe of the same active parameters, side by side in one run: CPU training tokens/s of
# rp-finetune (LoRA on attention and every expert, and full) on a generated gpt-oss (sinks, a sliding window
# on every other layer, biased router and experts, the clamped SwiGLU) and on a qwen3moe with the same
# experts, widths and attention; optionally with gpt-oss's experts in MXFP4 (QLoRA).
#
#   bench/finetune/gpt-oss.sh BUILD_DIR [THREADS]
#   env: EXPERTS (16), USED (4), EXPERT_FF (256), EMBD (256), LAYERS (4), WINDOW (128), SEQ (256), BATCH (4), STEPS (6)
#
# The two differ by what gpt-oss adds per layer (biases, sinks, the window, YaRN): the ratio is its cost; the
# window makes every other layer's attention cheaper once SEQ exceeds it.
set -euo pipefail
build=${1:?usage: gpt-oss.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
experts=${EXPERTS:-16} used=${USED:-4} eff=${EXPERT_FF:-256} embd=${EMBD:-256} layers=${LAYERS:-4} window=${WINDOW:-128}
seq=${SEQ:-256} batch=${BATCH:-4} steps=${STEPS:-6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--vocab "$shared/models/stories260K.gguf" --n-embd "$embd" --n-head 8 --n-head-kv 4 --head-dim 32 --n-layer "$layers"
        --experts "$experts" --experts-used "$used" --expert-ff "$eff" --n-ff $((eff * used)))
"$build/bin/rp-gguf" synth "$tmp/gpt-oss.gguf" "${common[@]}" --arch gpt-oss --window "$window" > "$tmp/gpt-oss.params"
"$build/bin/rp-gguf" synth "$tmp/qwen3moe.gguf" "${common[@]}" --arch qwen3moe > "$tmp/qwen3moe.params"
"$build/bin/rp-gguf" convert "$tmp/gpt-oss.gguf" "$tmp/gpt-oss-mxfp4.gguf" --type mxfp4_moe > /dev/null
echo "== gpt-oss ($(cat "$tmp/gpt-oss.params"), window $window) vs qwen3moe ($(cat "$tmp/qwen3moe.params")): $experts experts top $used," \
     "expert n_ff $eff, n_embd $embd, $layers layers, seq $seq, batch $batch, $steps steps, $threads threads"
run() {  # NAME MODEL FLAGS...: prints the done line, keeps tokens/s in $tmp/NAME.tps
  local name=$1 model=$2 line; shift 2
  line=$("$build/bin/rp-finetune" -m "$model" --data "$shared/models/reference/train.txt" -o "$tmp/out.gguf" \
    --seq-len "$seq" --batch "$batch" --steps "$steps" --lr 1e-3 -t "$threads" "$@" 2>&1 | grep '^done')
  printf '%-22s %s\n' "$name" "$line"
  sed -n 's/^done: .* s, \([0-9]*\) tok\/s.*/\1/p' <<<"$line" > "$tmp/$name.tps"
}
targets=attn_q,attn_k,attn_v,attn_output,ffn_gate_exps,ffn_up_exps,ffn_down_exps
run lora-gpt-oss "$tmp/gpt-oss.gguf" --lora-targets "$targets"
run lora-qwen3moe "$tmp/qwen3moe.gguf" --lora-targets "$targets"
run qlora-gpt-oss-mxfp4 "$tmp/gpt-oss-mxfp4.gguf" --lora-targets "$targets"
run full-gpt-oss "$tmp/gpt-oss.gguf" --full
run full-qwen3moe "$tmp/qwen3moe.gguf" --full
ratio() { awk -v a="$(cat "$tmp/$1.tps")" -v b="$(cat "$tmp/$2.tps")" -v what="$3" 'BEGIN { printf "%s = %.2f\n", what, a / b }'; }
ratio lora-gpt-oss lora-qwen3moe "LoRA: gpt-oss / qwen3moe tokens/s"
ratio qlora-gpt-oss-mxfp4 lora-gpt-oss "QLoRA on MXFP4 experts / LoRA on f32 (gpt-oss) tokens/s"
ratio full-gpt-oss full-qwen3moe "full: gpt-oss / qwen3moe tokens/s"
