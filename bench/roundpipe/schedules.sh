#!/usr/bin/env bash
# RoundPipe vs GPipe vs 1F1B on the real runtime, G = 2, 4, 8 (rp-bench roundpipe: emulated compute at the
# measured per-layer times, a link scaled like PCIe 4.0 on an RTX 4090), on a generated 20-layer llama
# (15M parameters, stories260K vocabulary), then the timelines of the G = 4 runs drawn by rp-trace.
#   bench/roundpipe/schedules.sh BUILD_DIR [OUT_DIR]
# Takes about 3 minutes (the emulated compute runs in real time).
set -euo pipefail
build=${1:?usage: schedules.sh BUILD_DIR [OUT_DIR]}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
source "$(dirname "$0")/llama20.sh"
synth_llama20
"$build/bin/rp-bench" roundpipe --model "$out/llama20.gguf" --trace-dir "$out" | tee "$out/schedules.txt"
for s in gpipe 1f1b roundpipe-async; do
  "$build/bin/rp-trace" "$out/$s-G4.json" -o "$out/$s-G4.svg" | tail -1
done
echo "results and timelines in $out"
