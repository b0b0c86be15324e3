#!/usr/bin/env bash
# hf_cases.sh BIN_DIR SHARED_MODELS_DIR OUT_DIR [CASE...]: the cases bench/gpu/peft_baseline.py's `hf` command checks
# in transformers + PEFT (tools/gpu-check.sh runs both on the GPU machine; tests/gpu runs this half here). Each case is
# a small random model of one architecture with a real vocabulary, in OUT_DIR/CASE/:
#   model.gguf            rp-gguf synth
#   a1.gguf               a LoRA adapter (default targets) made non-zero by two steps of rp-finetune (CPU)
#   step.gguf             one more step with lr 0 from a1 (--dump-grads): the batch and our logits of its first
#                         sequence with a1 applied
#   hf/                   rp-gguf export-hf model.gguf (weights, config.json, tokenizer files)
#   peft/                 rp-gguf export-peft a1.gguf (adapter_config.json, adapter_model.safetensors)
#   texts/N.txt, N.ids    texts and our token ids for them (rp-tokenize --no-bos --ids)
# Cases: llama (SentencePiece vocabulary), qwen3moe, phi3, gemma3, gpt-oss (Llama 3's BPE vocabulary), qwen35,
# qwen35moe, mistral3 (YaRN and the attention temperature).
# Exit status: 0 when every case was made; a case that failed is named on stderr and left out.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: hf_cases.sh BIN_DIR SHARED_MODELS_DIR OUT_DIR [CASE...]" >&2; exit 2; }
BIN="$1"; MODELS="$2"; OUT="$3"; shift 3
V="$MODELS/vocab"
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(llama qwen3moe phi3 gemma3 gpt-oss qwen35 qwen35moe mistral3)

synth_args() {  # the case's architecture, vocabulary and small shape
  local common=(--n-embd 64 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 96 --n-layer 2 --seed 11)
  case "$1" in
    llama)    echo --arch llama --vocab "$V/ggml-vocab-llama-spm.gguf" "${common[@]}" ;;
    qwen3moe) echo --arch qwen3moe --vocab "$V/ggml-vocab-qwen2.gguf" "${common[@]}" --experts 4 --experts-used 2 --expert-ff 32 ;;
    phi3)     echo --arch phi3 --vocab "$V/ggml-vocab-llama-spm.gguf" "${common[@]}" ;;
    gemma3)   echo --arch gemma3 --vocab "$V/ggml-vocab-llama-spm.gguf" "${common[@]}" --n-layer 3 --window 8 ;;
    gpt-oss)  echo --arch gpt-oss --vocab "$V/ggml-vocab-llama-bpe.gguf" "${common[@]}" --experts 4 --experts-used 2 --expert-ff 32 --window 8 ;;
    qwen35)   echo --arch qwen35 --vocab "$V/ggml-vocab-qwen2.gguf" "${common[@]}" --n-layer 4 --ssm-k-heads 2 --ssm-v-heads 4 --ssm-head-dim 16 \
                --full-attn-interval 4 ;;
    qwen35moe) echo --arch qwen35moe --vocab "$V/ggml-vocab-qwen2.gguf" "${common[@]}" --n-layer 4 --ssm-k-heads 2 --ssm-v-heads 4 \
                --ssm-head-dim 16 --full-attn-interval 4 --experts 4 --experts-used 2 --expert-ff 32 ;;
    mistral3) echo --arch mistral3 --vocab "$V/ggml-vocab-llama-bpe.gguf" "${common[@]}" --yarn 16 --yarn-ctx 256 --attn-temp 0.1 ;;
    *) return 1 ;;
  esac
}

# LoRA targets other than the defaults: gpt-oss's and qwen35moe's experts are packed parameters in transformers and
# their routers no Linear modules, which PEFT cannot wrap (rp-gguf export-peft refuses both).
lora_targets() {
  case "$1" in
    gpt-oss) echo --lora-targets attn_q,attn_k,attn_v,attn_output ;;
    qwen35moe) echo --lora-targets attn_qkv,attn_gate,ssm_beta,ssm_alpha,ssm_out,attn_q,attn_k,attn_v,attn_output,ffn_gate_shexp,ffn_up_shexp,ffn_down_shexp ;;
  esac
}

TEXTS=("Hello world" " The quick brown fox jumps over the lazy dog." "3.14159 and 2718281828, twice: 3.14159"
       "tabs	and
newlines,   spaces" "naïve café, Ünïcödé and 日本語 text")
failed=0
for c in "${CASES[@]}"; do
  d="$OUT/$c"
  rm -rf "$d"; mkdir -p "$d/texts"
  args=$(synth_args "$c") || { echo "hf_cases: unknown case $c" >&2; failed=1; continue; }
  # shellcheck disable=SC2207
  ft=(-m "$d/model.gguf" --data "$MODELS/reference/train.txt" --seq-len 32 --batch 1 --lora-rank 4 --lora-alpha 8 --threads 2
      $(lora_targets "$c"))
  # shellcheck disable=SC2086
  if "$BIN/rp-gguf" synth "$d/model.gguf" $args > "$d/log" 2>&1 &&
     "$BIN/rp-finetune" "${ft[@]}" --steps 2 --lr 1e-2 -o "$d/a1.gguf" >> "$d/log" 2>&1 &&
     "$BIN/rp-finetune" "${ft[@]}" --resume "$d/a1.gguf" --steps 1 --lr 0 --dump-grads "$d/step.gguf" -o "$d/a2.gguf" >> "$d/log" 2>&1 &&
     "$BIN/rp-gguf" export-hf "$d/model.gguf" -o "$d/hf" >> "$d/log" 2>&1 &&
     "$BIN/rp-gguf" export-peft "$d/a1.gguf" -m "$d/model.gguf" -o "$d/peft" >> "$d/log" 2>&1; then
    for i in "${!TEXTS[@]}"; do
      printf '%s' "${TEXTS[$i]}" > "$d/texts/$i.txt"
      "$BIN/rp-tokenize" -m "$d/model.gguf" -f "$d/texts/$i.txt" --no-bos --ids > "$d/texts/$i.ids" 2>> "$d/log" || failed=1
    done
    echo "hf_cases: $c ready in $d"
  else
    echo "hf_cases: $c failed (log: $d/log):" >&2
    tail -3 "$d/log" >&2
    failed=1
  fi
done
exit $failed
