#!/usr/bin/env bash
# Preference training's cost against SFT on the same tokens, side by side in one run: DPO on N pairs (prompt +
# chosen, prompt + rejected: two sequences each) against SFT on the same 2N sequences (prompt + completion, one
# padded sequence each), the same seq_len and sequences per step, on the host and through RoundPipe on simulated
# devices (CPU virtual devices, --devices 2).
#
#   bench/finetune/preference.sh BUILD_DIR [THREADS]
#   env: MODEL (default shared/models/stories260K.gguf), SEQ (128), N (pairs, 64), PAIRS (per step, 4),
#        STEPS (16), REPS (best of, 2)
#
# Prints each run's summary line, DPO's pairs/s and tokens/s against SFT's tokens/s (a DPO step is an SFT step
# over the same sequences plus the per-token head, so the ratio should be near 1), and the reference pass (one
# forward over the data before the first step) with the share of the run it takes.
set -euo pipefail
build=${1:?usage: preference.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
model=${MODEL:-$shared/models/stories260K.gguf}
seq=${SEQ:-128}
n=${N:-64}
pairs=${PAIRS:-4}
steps=${STEPS:-16}
reps=${REPS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Pairs of answers from the same words (awk's srand is seeded: the same files every run); the SFT file holds the
# same prompt + answer texts as prompt / completion examples.
awk -v n="$n" -v pairs="$tmp/pairs.jsonl" -v sft="$tmp/sft.jsonl" 'BEGIN {
  srand(11);
  split("once upon a time there was a little girl named lily she liked to play in the park with her dog the sun was warm and bright", w, " ");
  nw = length(w);
  for (i = 0; i < n; i++) {
    p = ""; for (j = 0; j < 12; j++) p = p (j ? " " : "") w[int(rand() * nw) + 1];
    c = ""; for (j = 0; j < 40; j++) c = c " " w[int(rand() * nw) + 1];
    r = ""; for (j = 0; j < 36; j++) r = r " " w[int(rand() * nw) + 1];
    printf "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", p, c, r > pairs;
    printf "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", p, c, p, r > sft;
  }
}'

run() { # run NAME ARGS... -> the best run's log in $tmp/NAME.log, its step time (s) on stdout
  local name=$1 best="" log
  shift
  for r in $(seq 1 "$reps"); do
    log="$tmp/$name.$r.log"
    "$build/bin/rp-finetune" -m "$model" -o "$tmp/out.gguf" --seq-len "$seq" --steps "$steps" --lr 1e-4 -t "$threads" "$@" > "$log" 2>&1 ||
      { cat "$log" >&2; exit 1; }
    local v
    v=$(sed -n 's/^done: [0-9]* steps in \([0-9.]*\) s.*/\1/p' "$log")
    if [ -z "$best" ] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$v; cp "$log" "$tmp/$name.log"; fi
  done
  echo "$best"
}

echo "== preference vs SFT: $(basename "$model"), $n pairs, seq $seq, $pairs pairs ($((2 * pairs)) sequences) per step, $steps steps, $threads threads, best of $reps"
for where in host devices; do
  dev=()
  [ "$where" = devices ] && dev=(--devices 2 --device-mem 256M)
  sft=$(run "sft-$where" --data "$tmp/sft.jsonl" --no-pack --batch $((2 * pairs)) "${dev[@]}")
  dpo=$(run "dpo-$where" --data "$tmp/pairs.jsonl" --method dpo --batch "$pairs" "${dev[@]}")
  echo "-- $where"
  echo "sft: $(grep -h '^done' "$tmp/sft-$where.log")"
  echo "dpo: $(grep -h '^done' "$tmp/dpo-$where.log")"
  ref=$(sed -n 's/^reference pass: .*, \([0-9.]*\) s .*/\1/p' "$tmp/dpo-$where.log")
  awk -v s="$sft" -v d="$dpo" -v r="$ref" -v steps="$steps" -v pairs="$pairs" -v seq="$seq" 'BEGIN {
    tok = steps * 2 * pairs * seq;
    printf "sft %.0f tok/s; dpo %.1f pairs/s, %.0f tok/s: %.2fx the SFT step time; reference pass %.2f s (%.0f%% of the DPO run)\n",
           tok / s, steps * pairs / d, tok / d, d / s, r, 100 * r / (r + d) }'
done
