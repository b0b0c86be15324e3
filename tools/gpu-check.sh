#!/usr/bin/env bash
# gpu-check.sh: everything that needs a GPU, in one call that fits in 10 minutes on one GPU machine.
#   1. configure + build with CUDA for this GPU's architecture only (nvidia-smi --query-gpu=compute_cap);
#   2. run test_cuda in three parts, each with its own counts in the JSON:
#      a. device: the Device conformance checks on the CUDA device (CudaDevice.*: memory, streams, events
#         across logical devices, copies, pinned/registered memory, hook) and its host-side rules;
#      b. backend: CudaBackend running graphs of every op family and an autodiff training graph vs CpuBackend;
#      c. kernels: every CUDA kernel against the CPU kernels (attention up to 8192 tokens; LM head + CE with a
#         151936-token vocabulary);
#      d. pipeline: the RoundPipe runtime on 1..3 logical CUDA devices (CudaPipeline.*: bit-identical masters for
#         any device count, plan and recompute grain; gradients close to the CPU Trainer);
#      a test that skips with "skipped: no CUDA device" on this machine counts as a failure (the GPU is unusable);
#   3. run rp-cuda-bench (GEMM TFLOP/s next to a bare cuBLAS bf16 GEMM, attention forward/backward TFLOP/s);
#   4. finetune_bench: LoRA finetuning steps of a Qwen3-1.7B-shaped model with rp-finetune --backend cuda,
#      resident on one logical device and streamed by RoundPipe over four; tokens/s, MFU, trace + timeline.
# Results: $OUT/gpu-check.json (one summary) and $OUT/gpu-check.log (everything printed), where OUT defaults
# to ./gpu-check-out. Exit status 0 only when the build and every test passed.
# Environment: RP_GPU_BUILD (build folder, default build-gpu-check in the repository), RP_GPU_JOBS (build jobs).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
BUILD="${RP_GPU_BUILD:-$ROOT/build-gpu-check}"
JOBS="${RP_GPU_JOBS:-$(nproc)}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu-check.log"
JSON="$OUT_DIR/gpu-check.json"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
: > "$LOG"

log() { echo "$@" | tee -a "$LOG"; }
json_str() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\n'; }

start=$(date +%s)
gpu="unknown"; cap=""
if command -v nvidia-smi > /dev/null; then
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')"
  nvidia-smi >> "$LOG" 2>&1
fi
if [ -z "$cap" ]; then
  log "error: no GPU found (nvidia-smi missing or silent)"
  printf '{"ok": false, "error": "no GPU found"}\n' > "$JSON"
  exit 1
fi
log "gpu: $gpu (sm_$cap), build: $BUILD, jobs: $JOBS"

# ---- 1. build ------------------------------------------------------------------------------------------------
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
build_ok=false
if cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRP_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$cap" -DRP_WERROR=ON >> "$LOG" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target test_cuda rp-cuda-bench rp-finetune rp-trace >> "$LOG" 2>&1; then
  build_ok=true
fi
build_s=$(( $(date +%s) - start ))
log "build: $build_ok (${build_s} s)"

# ---- 2. tests --------------------------------------------------------------------------------------------------
# run_tests PART FILTER: runs test_cuda on FILTER; sets PART_json to its counts and returns 0 when all passed.
tests_ok=true
run_tests() {
  local part="$1" filter="$2" t0 rc passed failed skipped names no_gpu ok=false
  t0=$(date +%s)
  timeout 300 "$BUILD/tests/test_cuda" --gtest_filter="$filter" > "$SCRATCH/$part.txt" 2>&1
  rc=$?
  cat "$SCRATCH/$part.txt" >> "$LOG"
  passed=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$SCRATCH/$part.txt" | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$SCRATCH/$part.txt" | grep -oE '[0-9]+' | head -1)
  failed=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$SCRATCH/$part.txt" | grep -oE '[0-9]+' | head -1)
  names="$(grep -E '^\[  FAILED  \] [A-Za-z]' "$SCRATCH/$part.txt" | sed 's/^\[  FAILED  \] //; s/ (.*//' |
           sort -u | tr '\n' ' ')"
  no_gpu=$(grep -c 'skipped: no CUDA device' "$SCRATCH/$part.txt")
  passed=${passed:-0}; skipped=${skipped:-0}; failed=${failed:-0}
  [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$no_gpu" -eq 0 ] && ok=true
  [ "$no_gpu" -gt 0 ] && names="$names(skipped without a usable GPU: $no_gpu)"
  [ "$rc" -eq 124 ] && names="$names(timed out after 300 s)"
  log "tests $part: passed $passed, failed $failed, skipped $skipped ($(( $(date +%s) - t0 )) s) $names"
  printf -v "${part}_json" '{"ok": %s, "passed": %s, "failed": %s, "skipped": %s, "failed_names": "%s"}' \
    "$ok" "$passed" "$failed" "$skipped" "$(json_str "$names")"
  $ok
}
device_json=null; backend_json=null; kernels_json=null; pipeline_json=null
if $build_ok; then
  run_tests device 'CudaDevice.*:CudaLogicalDevices.*' || tests_ok=false
  run_tests backend 'CudaBackend.*:CudaBackendPlan.*' || tests_ok=false
  run_tests kernels '-CudaDevice.*:CudaLogicalDevices.*:CudaBackend.*:CudaBackendPlan.*:CudaPipeline.*' || tests_ok=false
  run_tests pipeline 'CudaPipeline.*' || tests_ok=false
else
  tests_ok=false
fi

# ---- 3. benchmarks ---------------------------------------------------------------------------------------------
bench='null'
if $build_ok; then
  if timeout 240 "$BUILD/bin/rp-cuda-bench" "$SCRATCH/bench.json" 2>&1 | tee -a "$LOG"; then
    [ -s "$SCRATCH/bench.json" ] && bench="$(cat "$SCRATCH/bench.json")"
  else
    log "bench: failed"
  fi
fi

# ---- 4. finetune benchmarks ------------------------------------------------------------------------------------
# A Qwen3-1.7B-shaped model with random bf16 weights (28 layers, n_embd 2048, 16 heads and 8 KV heads of 128,
# n_ff 6144, tied head; the qwen2 BPE vocabulary of shared/models/vocab sets the vocabulary rows), generated by
# tests/cuda/bench/gen_synth.cpp; LoRA rank 16 on the default targets, trained by rp-finetune --backend cuda on
# repeated shared/models/reference/train.txt, sequences of FT_SEQ tokens, FT_BATCH per step in FT_MICRO
# micro-batches, FT_STEPS steps:
#   resident  one logical device with memory for everything (the runtime still uploads each call's layers
#             from host memory, but there is no pipeline: one device runs every stage);
#   streamed  four logical devices of FT_STREAM_MEM each on the same GPU: none can hold the model (3.4 GB of
#             bf16 weights), so the planner splits it into stages that stream through them round-robin.
# tokens/s: the median of the steps after the first (warm-up: cuBLAS handles, graph buffers growing). MFU =
# 6 x params x tokens/s / peak, peak = the bare cuBLAS bf16 GEMM rp-cuda-bench measured, else the H200's dense
# bf16 989 TFLOP/s. The streamed run writes a Chrome trace and its timeline (rp-trace), copied to $OUT_DIR.
# Time: generation ~1 min (single-threaded writer), each run under FT_TIMEOUT s and within what is left of the
# script's budget RP_GPU_BUDGET_S (default 570 s of the 10 minutes, counted from the start): a run that would not
# fit is skipped ("skipped": "no time left") or cut short by its timeout (rc 124).
FT_SEQ="${FT_SEQ:-512}"; FT_BATCH="${FT_BATCH:-8}"; FT_MICRO="${FT_MICRO:-4}"; FT_STEPS="${FT_STEPS:-4}"
FT_STREAM_MEM="${FT_STREAM_MEM:-4G}"; FT_TIMEOUT="${FT_TIMEOUT:-120}"; BUDGET_S="${RP_GPU_BUDGET_S:-570}"
finetune_bench() {
  local shared="${RP_SHARED_DIR:-$ROOT/../shared}" dir="$SCRATCH/ft" blas params peak peak_src runs="" i
  if [ $(( BUDGET_S - ($(date +%s) - start) )) -lt 150 ]; then
    log "finetune bench: skipped, less than 150 s left of the budget" >&2
    echo '{"skipped": "no time left"}'; return
  fi
  mkdir -p "$dir"
  blas=$(sed -n 's/^OPENBLAS_LIBRARY:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null | grep -v NOTFOUND || true)
  if ! ${CXX:-g++} -std=c++20 -O2 -I"$ROOT" "$ROOT/tests/cuda/bench/gen_synth.cpp" "$ROOT/tests/live/synth_model.cpp" \
        "$BUILD/ggml_rp/libggml_rp.a" "$BUILD/gguf/libgguf.a" ${blas:+"$blas"} -fopenmp -pthread -o "$dir/gen_synth" \
        >> "$LOG" 2>&1; then
    log "finetune bench: cannot build tests/cuda/bench/gen_synth.cpp" >&2; echo null; return
  fi
  local t0=$(date +%s)
  params=$(timeout 180 "$dir/gen_synth" "$dir/qwen3-1.7b.gguf" "$shared/models/vocab/ggml-vocab-qwen2.gguf" \
             qwen3 2048 16 8 128 6144 28 1 bf16 2>> "$LOG" | sed -n 's/^params //p')
  if [ -z "$params" ]; then log "finetune bench: model generation failed" >&2; echo null; return; fi
  log "finetune bench: qwen3-1.7b-shaped model, $params parameters, generated in $(( $(date +%s) - t0 )) s" >&2
  for i in $(seq 100); do cat "$shared/models/reference/train.txt"; done > "$dir/train.txt"
  peak=$(grep '"cublas_bf16_peak"' "$SCRATCH/bench.json" 2>/dev/null | sed -n 's/.*"tflops": \([0-9.]*\).*/\1/p' | sort -g | tail -1)
  peak_src="rp-cuda-bench cublas_bf16_peak"
  if [ -z "$peak" ]; then peak=989; peak_src="H200 dense bf16 datasheet"; fi
  # run NAME DEVICES MEM SHARE [extra flags]: one rp-finetune run within 1/SHARE of the time left; appends its
  # JSON to runs.
  run() {
    local name="$1" n="$2" mem="$3" share="$4" rc tps tps_all first_s wall t1 limit; shift 4
    t1=$(date +%s)
    limit=$(( (BUDGET_S - (t1 - start) - 15) / share ))
    [ "$limit" -gt "$FT_TIMEOUT" ] && limit=$FT_TIMEOUT
    if [ "$limit" -lt 30 ]; then
      log "finetune bench $name: skipped, ${limit} s left of the budget" >&2
      runs="$runs${runs:+, }\"$name\": {\"ok\": false, \"skipped\": \"no time left\"}"
      return
    fi
    timeout "$limit" "$BUILD/bin/rp-finetune" -m "$dir/qwen3-1.7b.gguf" --data "$dir/train.txt" -o "$dir/$name.gguf" \
      --backend cuda --devices "$n" --device-mem "$mem" --lora-rank 16 --seq-len "$FT_SEQ" --batch "$FT_BATCH" \
      --micro-batches "$FT_MICRO" --steps "$FT_STEPS" --lr 1e-4 "$@" > "$dir/$name.txt" 2>&1
    rc=$?
    wall=$(( $(date +%s) - t1 ))
    cat "$dir/$name.txt" >> "$LOG"
    tps_all=$(sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$dir/$name.gguf.metrics.jsonl" 2>/dev/null | tail -n +2)
    tps=$(printf '%s\n' $tps_all | sort -g | awk '{v[NR]=$1} END {if (NR) print (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}')
    first_s=$(sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$dir/$name.gguf.metrics.jsonl" 2>/dev/null | head -1)
    local mfu=null ok=false
    if [ "$rc" -eq 0 ] && [ -n "$tps" ]; then
      ok=true
      mfu=$(awk -v p="$params" -v t="$tps" -v k="$peak" 'BEGIN { printf "%.4f", 6 * p * t / (k * 1e12) }')
    fi
    log "finetune bench $name: rc $rc, $n device(s) x $mem, ${tps:-?} tok/s (median after step 1; step 1 ${first_s:-?}), MFU ${mfu}, ${wall} s" >&2
    runs="$runs${runs:+, }\"$name\": {\"ok\": $ok, \"rc\": $rc, \"devices\": $n, \"device_mem\": \"$mem\", \"tokens_per_s\": ${tps:-null}, \"first_step_tokens_per_s\": ${first_s:-null}, \"mfu\": $mfu, \"seconds\": $wall}"
  }
  run resident 1 80G 2
  run streamed 4 "$FT_STREAM_MEM" 1 --trace "$dir/streamed.trace.json"
  local trace_json=null
  if [ -s "$dir/streamed.trace.json" ]; then
    cp "$dir/streamed.trace.json" "$OUT_DIR/finetune-streamed.trace.json"
    if "$BUILD/bin/rp-trace" "$dir/streamed.trace.json" -o "$OUT_DIR/finetune-streamed.timeline.svg" \
         --title "Qwen3-1.7B shape, LoRA, 4 logical CUDA devices x $FT_STREAM_MEM" > "$dir/trace.txt" 2>&1; then
      trace_json="\"finetune-streamed.timeline.svg\""
    fi
    cat "$dir/trace.txt" >> "$LOG"
  fi
  printf '{"model": "qwen3-1.7b-shape bf16 random", "params": %s, "seq_len": %s, "batch": %s, "micro_batches": %s, "steps": %s, "lora_rank": 16, "peak_tflops": %s, "peak_source": "%s", %s, "timeline": %s}\n' \
    "$params" "$FT_SEQ" "$FT_BATCH" "$FT_MICRO" "$FT_STEPS" "$peak" "$peak_src" "$runs" "$trace_json"
}
finetune='null'
if $build_ok; then
  finetune="$(finetune_bench)"
fi

total_s=$(( $(date +%s) - start ))
ok=false
$build_ok && $tests_ok && ok=true
{
  printf '{\n  "ok": %s,\n  "gpu": "%s",\n  "compute_cap": "%s",\n' "$ok" "$(json_str "$gpu")" "$cap"
  printf '  "build": {"ok": %s, "seconds": %s},\n' "$build_ok" "$build_s"
  printf '  "tests": {"ok": %s, "device": %s, "backend": %s, "kernels": %s, "pipeline": %s},\n' \
    "$tests_ok" "$device_json" "$backend_json" "$kernels_json" "$pipeline_json"
  printf '  "bench": %s,\n' "$bench"
  printf '  "finetune_bench": %s,\n' "${finetune:-null}"
  printf '  "seconds": %s\n}\n' "$total_s"
} > "$JSON.tmp" && mv "$JSON.tmp" "$JSON"
log "summary: $JSON"
$ok
