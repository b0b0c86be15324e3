#!/usr/bin/env bash
# Packing on vs off (rp-finetune --pack / --no-pack), side by side in one run: trained tokens per second on a
# chat-style JSONL whose examples spread from about 20 to 400 tokens (the long tail of real instruction data:
# most examples short, a few long), one epoch over the same examples, seq 1024.
#
#   bench/finetune/packing.sh BUILD_DIR [THREADS]
#   env: MODEL (default shared/models/stories260K.gguf), SEQ (1024), N (examples, 400), BATCH (4), MODE
#        ("" = LoRA, or --full), REPS (best of, 2)
#
# Prints the padding fractions (from rp-finetune's data line), each run's summary and the speedup. Unpacked,
# every example is one padded sequence of SEQ positions; packed, examples share sequences and attend only to
# themselves, so the steps shrink by the padding saved and attention by the smaller blocks.
set -euo pipefail
build=${1:?usage: packing.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
model=${MODEL:-$shared/models/stories260K.gguf}
seq=${SEQ:-1024}
n=${N:-400}
batch=${BATCH:-4}
reps=${REPS:-2}
mode=${MODE:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Example lengths: 20 + a geometric-like tail (awk's srand is seeded: the same file every run), in words
# (stories260K's tokenizer makes about 1.3 tokens of each).
awk -v n="$n" 'BEGIN {
  srand(7);
  split("once upon a time there was a little girl named lily she liked to play in the park with her dog the sun was warm and bright", w, " ");
  nw = length(w);
  for (i = 0; i < n; i++) {
    len = int(15 + (-log(1 - rand()) * 60)); if (len > 300) len = 300;
    p = ""; for (j = 0; j < 4 + len / 6; j++) p = p (j ? " " : "") w[int(rand() * nw) + 1];
    c = ""; for (j = 0; j < len; j++) c = c (j ? " " : "") w[int(rand() * nw) + 1];
    printf "{\"prompt\": \"%s\\n\", \"completion\": \"%s\"}\n", p, c;
  }
}' > "$tmp/chat.jsonl"

run() { # run FLAG -> prints "trained_tok_s" and keeps the log
  local best=0 log
  for r in $(seq 1 "$reps"); do
    log="$tmp/run$1.$r.log"
    "$build/bin/rp-finetune" -m "$model" --data "$tmp/chat.jsonl" -o "$tmp/out.gguf" --seq-len "$seq" --batch "$batch" \
      --epochs 1 --lr 1e-3 -t "$threads" $mode "$1" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
    local v
    v=$(sed -n 's/^done: .*(\([0-9]*\) trained tok\/s).*/\1/p' "$log")
    if [ "$v" -gt "$best" ]; then best=$v; cp "$log" "$tmp/best$1.log"; fi
  done
  echo "$best"
}

echo "== packing: $(basename "$model") ${mode:-lora}, $n examples, seq $seq, batch $batch, $threads threads, best of $reps"
off=$(run --no-pack)
on=$(run --pack)
grep -h "examples" "$tmp/best--no-pack.log" "$tmp/best--pack.log"
echo "--no-pack: $(grep -h '^done' "$tmp/best--no-pack.log")"
echo "--pack:    $(grep -h '^done' "$tmp/best--pack.log")"
awk -v a="$on" -v b="$off" 'BEGIN { printf "trained tokens/s: packed %d, unpacked %d, speedup %.2fx\n", a, b, a / b }'
