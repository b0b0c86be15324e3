#!/usr/bin/env bash
# QLoRA quant sweep (issue 17): how much worse is an adapter trained on a Q4_K_M base than one trained on F16,
# and how much does the base's quantization cost at inference? One adapter is trained on an F16 base and one on
# its Q4_K_M (made by our rp-gguf convert, which writes llama-quantize's bytes); each adapter is then applied to
# each base (F16, Q8_0, Q5_K_M, Q4_K_M) and compared with the reference, F16 base + F16 adapter, by
# rp-perplexity --kl-divergence (llama-perplexity's definitions): mean KL with its standard error, the change of
# perplexity, and how often the most likely token is the same.
#
#   bench/quant/sweep.sh BUILD_DIR [THREADS]
#   env: STEPS (200), SEQ (64), CTX (SEQ: the positions the adapter was trained on), WORK (scratch dir, a fresh temp dir)
#
# The base is a generated llama (rp-gguf synth: n_embd 256, 4 layers, n_ff 768, the stories260K vocabulary; every
# row a multiple of 256 so that every K type applies) with random weights: the adapters learn the text from
# scratch, so the absolute perplexities mean little; the differences between rows are the point. Training and
# evaluation text: examples/data/stories.txt (evaluation on the same text: this measures what quantization does
# to what the adapter learned, not generalisation).
#
# Last measured 2026-12-01 (2-core Intel Xeon with AVX-512), STEPS=150, defaults otherwise; each adapter trained
# in ~65 s (587 tok/s), loss 10.70 -> 0.003 (it memorises the text); reference PPL 1.0690:
#   | adapter on | applied to | base MiB | mean KL to reference | PPL      | same top       |
#   | f16        | f16        | 7.02     | 0.000000             | 1.068971 | 100.000 %      |
#   | f16        | q8_0       | 3.74     | 0.000122 ± 0.000015  | 1.070559 | 100.000 %      |
#   | f16        | q5_k_m     | 2.51     | 0.004986 ± 0.000483  | 1.073812 |  99.707 ± 0.21 |
#   | f16        | q4_k_m     | 2.15     | 0.033064 ± 0.005384  | 1.111125 |  98.534 ± 0.46 |
#   | q4_k_m     | f16        | 7.02     | 0.127004 ± 0.011927  | 1.119122 |  97.507 ± 0.60 |
#   | q4_k_m     | q8_0       | 3.74     | 0.126246 ± 0.011808  | 1.119907 |  97.507 ± 0.60 |
#   | q4_k_m     | q5_k_m     | 2.51     | 0.132997 ± 0.012575  | 1.130309 |  97.361 ± 0.61 |
#   | q4_k_m     | q4_k_m     | 2.15     | 0.113745 ± 0.011486  | 1.075417 |  98.680 ± 0.44 |
#   The QLoRA adapter is best on the base it was trained on (PPL 1.075 vs the reference's 1.069) and worse on
#   the F16 base (1.119): it learned to correct its base's quantization error.
set -euo pipefail
build=${1:?usage: sweep.sh BUILD_DIR [THREADS]}
threads=${2:-2}
steps=${STEPS:-200}
seq=${SEQ:-64}
ctx=${CTX:-$seq}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
work=${WORK:-$(mktemp -d)}
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT
bin=$build/bin
data=$root/examples/data/stories.txt

"$bin/rp-gguf" synth "$work/f32.gguf" --vocab "$shared/models/stories260K.gguf" --n-layer 4 --n-embd 256 --n-head 4 \
  --n-head-kv 4 --n-ff 768 --seed 7 >/dev/null
declare -A base
for t in f16 q8_0 q5_k_m q4_k_m; do
  base[$t]=$work/base-$t.gguf
  "$bin/rp-gguf" convert "$work/f32.gguf" "${base[$t]}" --type "$t" --threads "$threads" >/dev/null
done
for t in f16 q4_k_m; do
  echo "training an adapter on the $t base ($steps steps of $seq tokens)" >&2
  "$bin/rp-finetune" -m "${base[$t]}" --data "$data" -o "$work/adapter-$t.gguf" --seq-len "$seq" --batch 4 \
    --steps "$steps" --lr 3e-3 --lora-rank 16 --lora-alpha 32 --seed 1 -t "$threads" >"$work/train-$t.log" 2>&1
  grep -E "^step +$steps\b|final|loss" "$work/train-$t.log" | tail -1 >&2 || true
done
"$bin/rp-perplexity" -m "${base[f16]}" --lora "$work/adapter-f16.gguf" -f "$data" -c "$ctx" -t "$threads" \
  --kl-divergence-base "$work/ref.kld" >"$work/ref.txt" 2>/dev/null
ref_ppl=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$work/ref.txt")

printf '\nreference: F16 base + F16 adapter, PPL %s on %s (%s-token chunks)\n\n' "$ref_ppl" "$(basename "$data")" "$ctx"
printf '| adapter trained on | applied to | base MiB | mean KL to reference | PPL | dPPL | same top token |\n'
printf '|---|---|---:|---:|---:|---:|---:|\n'
for a in f16 q4_k_m; do
  for t in f16 q8_0 q5_k_m q4_k_m; do
    out=$("$bin/rp-perplexity" -m "${base[$t]}" --lora "$work/adapter-$a.gguf" -t "$threads" \
      --kl-divergence-base "$work/ref.kld" --kl-divergence 2>/dev/null)
    kld=$(sed -n 's/^Mean    KLD: *\([-0-9.]*\) +\/- *\([0-9.]*\)/\1 ± \2/p' <<<"$out")
    ppl=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\) +\/- .*/\1/p' <<<"$out")
    dppl=$(sed -n 's/^Mean PPL(Q)-PPL(base) *: *\([-0-9.]*\) +\/- *\([0-9.]*\)/\1 ± \2/p' <<<"$out")
    top=$(sed -n 's/^Same top p: *\([0-9.]*\) +\/- *\([0-9.]*\) %/\1 ± \2 %/p' <<<"$out")
    mib=$(awk -v b="$(stat -c %s "${base[$t]}")" 'BEGIN { printf "%.2f", b / 1048576 }')
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$a" "$t" "$mib" "$kld" "$ppl" "$dppl" "$top"
  done
done
