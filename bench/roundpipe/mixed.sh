#!/usr/bin/env bash
# RoundPipe on mixed-speed devices (issue #37): the paper's round-robin dispatch against dispatch by readiness
# (speeds given, and measured by the runtime), and against the ideal (the step's compute at speed 1 over the
# devices' summed speed), on 4 and 8 devices with the mixes 1:1, 1:0.5 (half the devices at half speed) and one
# straggler at 0.25 (rp-bench mixed: the real runtime, emulated compute at the measured per-layer times, a link
# scaled like PCIe 4.0 on an RTX 4090), on a generated 20-layer llama (stories260K vocabulary); then the
# timelines and job assignments of the 4-device 1:0.5 async runs drawn by rp-trace.
#   bench/roundpipe/mixed.sh BUILD_DIR [OUT_DIR]
# Takes about 5 minutes (the emulated compute runs in real time), sync and async steps; the step times are the
# steady state's (rp-bench mixed: the time between call starts, no synchronize inside the window).
set -euo pipefail
build=${1:?usage: mixed.sh BUILD_DIR [OUT_DIR]}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
source "$(dirname "$0")/llama20.sh"
synth_llama20
"$build/bin/rp-bench" mixed --model "$out/llama20.gguf" --trace-dir "$out" | tee "$out/mixed.txt"
for d in round-robin ready__given_; do
  "$build/bin/rp-trace" "$out/mixed-G4-async-1_0.5-$d.json" -o "$out/mixed-G4-async-1_0.5-$d.svg" --assignment | tail -3
done
echo "results and timelines in $out"
