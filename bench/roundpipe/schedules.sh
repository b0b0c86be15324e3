#!/usr/bin/env bash
# RoundPipe vs GPipe vs 1F1B on the real runtime, G = 2, 4, 8 (rp-bench roundpipe: emulated compute at the
# measured per-layer times, a link scaled like PCIe 4.0 on an RTX 4090), on a generated 20-layer llama
# (15M parameters, stories260K vocabulary), then the timelines of the G = 4 runs drawn by rp-trace.
#   bench/roundpipe/schedules.sh BUILD_DIR [OUT_DIR]
# Takes about 3 minutes (the emulated compute runs in real time).
set -euo pipefail
build=${1:?usage: schedules.sh BUILD_DIR [OUT_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
blas=$(ls /usr/lib/x86_64-linux-gnu/libopenblas.so 2>/dev/null || true)
${CXX:-g++} -std=c++20 -O2 -I"$root" "$root/bench/infer/gen_model.cpp" "$root/tests/live/synth_model.cpp" \
  "$build/ggml_rp/libggml_rp.a" "$build/gguf/libgguf.a" ${blas:+"$blas"} -fopenmp -pthread -o "$out/gen_model"
"$out/gen_model" "$out/llama20.gguf" "$shared/models/stories260K.gguf" 256 4 2 704 20
"$build/bin/rp-bench" roundpipe --model "$out/llama20.gguf" --trace-dir "$out" | tee "$out/schedules.txt"
for s in gpipe 1f1b roundpipe-async; do
  "$build/bin/rp-trace" "$out/$s-G4.json" -o "$out/$s-G4.svg" | tail -1
done
echo "results and timelines in $out"
