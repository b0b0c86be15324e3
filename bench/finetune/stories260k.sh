#!/usr/bin/env bash
# Throughput and peak memory of rp-finetune on stories260K (LoRA and full), for the report / regressions.
#   bench/finetune/stories260k.sh BUILD_DIR [THREADS]
# Prints the summary line of each run (tokens/s, loss, peak graph bytes, peak RSS) and /usr/bin/time's RSS.
set -euo pipefail
build=${1:?usage: stories260k.sh BUILD_DIR [THREADS]}
threads=${2:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in "" "--full"; do
  echo "== stories260K ${mode:-lora}, seq 128, batch 8, 20 steps, $threads threads"
  /usr/bin/time -f "max RSS %M KiB, %e s wall, %U s user" \
    "$build/bin/rp-finetune" -m "$shared/models/stories260K.gguf" --data "$shared/models/reference/train.txt" \
    -o "$tmp/out.gguf" --seq-len 128 --batch 8 --steps 20 --lr 1e-3 -t "$threads" $mode 2>&1 | grep -E "^done|RSS"
done
