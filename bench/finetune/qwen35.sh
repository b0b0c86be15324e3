#!/usr/bin/env bash
# Qwen3.5's hybrid (Gated DeltaNet layers, a gated full attention layer every fourth) vs a dense qwen3 of about the
# same parameters, side by side in one run: CPU training tokens/s and peak RSS of rp-finetune (LoRA on the default
# targets, one sequence per step) at growing sequence lengths; then the longest sequence one 24 GB device trains
# (rp-simulate --max-seq, 8 devices, LoRA r32) for the hybrid MoE shapes qwen3.5-35b-a3b and qwen3-next-80b-a3b beside
# qwen3-30b-a3b (the same 3B active parameters), and for Qwen3.5's dense hybrids beside the dense qwen3 of about
# their size.
#
#   bench/finetune/qwen35.sh BUILD_DIR [THREADS]
#   env: EMBD (256), LAYERS (8), SEQS ("256 2048 8192"), STEPS (2)
#
# Attention's cost grows with the square of the sequence, the delta rule's linearly (a fixed state per head):
# the hybrid, with one attention layer in four, should pull ahead at long sequences.
#
# Measured 2026-12-07 (2-core Intel Xeon, 2 threads; SEQS="2048 8192"): qwen35 / qwen3 tokens/s 1.22 at 2048 (3508 vs
# 2871), 1.98 at 8192 (2174 vs 1098). The longest sequence on 24 GB, before (006de9c) -> after the gated norm as one op,
# a split's gradient buffer taken after its last part and the allocator's crowded-first placement:
#   qwen3.5-35b-a3b 90,960 -> 97,906   qwen3-next-80b-a3b 72,776 -> 78,340   (qwen3-30b-a3b 157,736)
#   qwen3.5-0.8b 183,070 -> 198,433 (qwen3-0.6b 283,525)   qwen3.5-2b 162,840 -> 170,156 (qwen3-1.7b 238,744)
#   qwen3.5-4b 104,098 -> 111,754   qwen3.5-9b 91,042 -> 96,882 (llama3.1-8b 147,439)
#   qwen3.5-27b 62,573 -> 66,885 (qwen3-32b 78,131)
# Later the same day, dz written over the gated norm's output gradient (its reshape hands the out projection's
# input gradient on as the norm's own) with the allocator's third order (crowded, then longest-lived first):
#   qwen3.5-4b 111,754 -> 114,901   qwen3.5-9b 96,882 -> 98,988   qwen3.5-27b 66,885 -> 67,660
#   qwen3.5-35b-a3b 97,906 -> 101,760   qwen3-next-80b-a3b 78,340 -> 81,425   (0.8b and 2b unchanged: their
#   attention layers decide)
# Later still, the delta rule's backward reading a copy of the chunk states (o freed before its peak) and a local
# search over the allocator's placement order (the greedy orders left these graphs up to a fifth above their live
# bound):
#   qwen3.5-4b 114,901 -> 120,488   qwen3.5-9b 98,988 -> 105,900   qwen3.5-27b 67,660 -> 75,564
#   qwen3.5-35b-a3b 101,760 -> 105,864   qwen3-next-80b-a3b 81,425 -> 84,712   qwen3.5-2b 170,156 -> 172,012
#   qwen3.5-0.8b 198,433 -> 200,139
# Before the copy, a DeltaNet layer's backward held about 39k floats a token at its peak (4B: the conv's 8192 pre-activations, q,
# k and v, the delta rule's output and its gradient, the gated norm's gradients, the normed input), its gated
# attention layers about 34k: the next steps are the delta rule reading q, k, v from the convolution's output (silu
# and the L2 norms inside it) and token-chunked DeltaNet layers.
set -euo pipefail
build=${1:?usage: qwen35.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
embd=${EMBD:-256} layers=${LAYERS:-8} seqs=${SEQS:-"256 2048 8192"} steps=${STEPS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--vocab "$shared/models/stories260K.gguf" --n-embd "$embd" --n-head 4 --n-head-kv 2 --head-dim 64 --n-layer "$layers"
        --n-ff $((embd * 3)) --n-ctx 16384)
"$build/bin/rp-gguf" synth "$tmp/qwen35.gguf" "${common[@]}" --arch qwen35 --n-rot 16 --ssm-k-heads 2 --ssm-v-heads 4 \
  --ssm-head-dim 64 > "$tmp/qwen35.params"
"$build/bin/rp-gguf" synth "$tmp/qwen3.gguf" "${common[@]}" --arch qwen3 > "$tmp/qwen3.params"
echo "== qwen35 ($(cat "$tmp/qwen35.params")) vs qwen3 ($(cat "$tmp/qwen3.params")): n_embd $embd, $layers layers, LoRA defaults," \
     "1 sequence a step, $steps steps, $threads threads ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
# A text long enough for the longest sequence: the reference text, repeated.
for _ in $(seq 1 40); do cat "$shared/models/reference/train.txt"; done > "$tmp/long.txt"
printf '| seq | qwen35 tok/s | qwen3 tok/s | qwen35 / qwen3 | qwen35 peak RSS | qwen3 peak RSS |\n|---:|---:|---:|---:|---:|---:|\n'
run() {  # MODEL SEQ: "tok/s peak_rss_MiB"
  "$build/bin/rp-finetune" -m "$1" --data "$tmp/long.txt" -o "$tmp/out.gguf" --seq-len "$2" --batch 1 --steps "$steps" --lr 1e-3 \
    -t "$threads" 2>&1 | sed -n 's/^done: .* s, \([0-9]*\) tok\/s.*peak RSS \([0-9.]*\) MiB.*/\1 \2/p'
}
for s in $seqs; do
  read -r a ra < <(run "$tmp/qwen35.gguf" "$s")
  read -r b rb < <(run "$tmp/qwen3.gguf" "$s")
  awk -v s="$s" -v a="$a" -v b="$b" -v ra="$ra" -v rb="$rb" \
    'BEGIN { printf "| %d | %d | %d | %.2f | %.1f MiB | %.1f MiB |\n", s, a, b, a / b, ra, rb }'
done
echo
echo "== the longest sequence one 24 GB device trains (8 devices, bf16 weights, LoRA r32)"
for m in qwen3.5-35b-a3b qwen3-next-80b-a3b qwen3-30b-a3b qwen3.5-0.8b qwen3-0.6b qwen3.5-2b qwen3-1.7b qwen3.5-4b qwen3.5-9b \
  llama3.1-8b qwen3.5-27b qwen3-32b; do
  "$build/bin/rp-simulate" --max-seq --model "$m" --device-mem 24G | grep -E '^(model|max seq):' | sed 's/ (.*//'
done
