#!/usr/bin/env bash
# Soak: STEPS (2000) LoRA steps on stories260K through 4 CPU virtual devices with random delays injected in
# every stream and runtime thread (--inject-delays), against the same steps on the host. Reports the
# process's RSS at step 100 and at the last step (from the metrics log: it must not grow — no leak) and
# whether the two adapters are byte-identical (sync steps: delays must not change a bit).
#   bench/soak/stories260k.sh BUILD_DIR [STEPS]
set -euo pipefail
build=${1:?usage: stories260k.sh BUILD_DIR [STEPS]}
steps=${2:-2000}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(-m "$shared/models/stories260K.gguf" --data "$shared/models/reference/train.txt" --seq-len 32 --batch 4
        --micro-batches 2 --steps "$steps" --epochs 1000 -t 2 --lora-rank 4 --lr 1e-3)
t0=$(date +%s)
"$build/bin/rp-finetune" "${common[@]}" -o "$tmp/host.gguf" >"$tmp/host.log" 2>&1
t1=$(date +%s)
"$build/bin/rp-finetune" "${common[@]}" -o "$tmp/pipe.gguf" --devices 4 --device-mem 8M --inject-delays 12345 >"$tmp/pipe.log" 2>&1
t2=$(date +%s)
rss() {  # METRICS STEP
  sed -n "s/.*\"step\":$2,.*\"rss_bytes\":\([0-9]*\).*/\1/p" "$1" | head -1
}
for run in host pipe; do
  m=$tmp/$run.gguf.metrics.jsonl
  a=$(rss "$m" 100) b=$(rss "$m" "$steps")
  printf "%-5s RSS at step 100: %s bytes, at step %s: %s bytes (%+.2f%%)\n" "$run" "$a" "$steps" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN {print 100 * (b - a) / a}')"
done
echo "host $((t1 - t0)) s, 4 devices with delays $((t2 - t1)) s"
if cmp -s "$tmp/host.gguf" "$tmp/pipe.gguf"; then echo "adapters: byte-identical"; else echo "adapters: DIFFERENT"; exit 1; fi
