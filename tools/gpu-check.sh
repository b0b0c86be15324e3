#!/usr/bin/env bash
# gpu-check.sh [--dry-run]: everything that needs a GPU, in one call that fits the device tool's 10 minutes.
# Prepare the call with tools/gpu-prep.sh (it carries GoogleTest's sources and the test models, and prints the
# exact device call). Phases, in the order that yields the headline figures first; each has a fixed share of
# the budget (RP_GPU_BUDGET_S, default 540 s; the shares are scaled to it) and ends at the sum of the shares up
# to it, so a phase can use what earlier ones left but never what later ones were given:
#   machine       nvidia-smi, the GPU's compute capability, the runtime (Firecracker or gVisor: kernel 4.4.0)
#   build         CMake + ninja for this GPU's architecture only, tests included, no -Werror (an unknown host
#                 compiler must not stop the check)
#   kernel_tests  the kernel suites of test_cuda (launch rules, ops, GEMM, attention, cross-entropy) and
#                 test_quant's CudaDequant, each suite in its own process (a sticky CUDA error in one cannot fail
#                 the others), with its exit code, counts, the last [ RUN ] line (where a crash happened) and the
#                 first failure message; a suite that skips for want of a usable GPU counts as failed; a suite
#                 that crashed has its last test run again under cuda-gdb for the host backtrace (the build
#                 carries line tables, -g1)
#   bench         rp-cuda-bench: GEMM TFLOP/s next to a bare cuBLAS bf16 GEMM on random data, attention fwd/bwd
#   probe         setup of a small real-vocabulary qwen3 on one CUDA device with each way of pinning the frozen
#                 weights (--pin alloc | register | off): whether it trains, how long pinning took (rp-finetune's
#                 "host:" line); the first that trains is the one the finetune runs use
#   finetune      LoRA (rank 32, alpha 16, all linear layers) steps of a Qwen3-1.7B-shaped bf16 model written by
#                 rp-gguf synth, resident on one logical device (the frozen weights uploaded once) and streamed by
#                 RoundPipe over four (--resident-weights off: every job uploads its layers); tokens/s, MFU,
#                 whether the weights stayed resident and the bytes each run sent, the streamed run's trace and timeline (timed without --trace's callbacks; a third, short
#                 traced run gives the timeline when there is time)
#   peft          the peer on the same GPU, same shape, sequence length, batch and rank: transformers + PEFT
#                 (bench/gpu/peft_baseline.py): tokens/s, peak memory; and the cross-check of our logits and LoRA
#                 gradients against transformers' Qwen3 on the same weights; and our exports in transformers (hf):
#                 a small model of each exported architecture (bench/gpu/hf_cases.sh) as rp-gguf export-hf and
#                 export-peft write it, loaded with AutoModelForCausalLM + PeftModel (logits against ours with the
#                 same adapter) and AutoTokenizer (ids against ours)
#   tests         the remaining test_cuda suites (devices, backend, plans, pipeline), one process each
#   sanitizer     compute-sanitizer --tool memcheck over one short finetune step (works on Firecracker, refused
#                 on gVisor: recorded either way)
# Every command runs under `timeout -k`, so a hung one is killed within its phase.
# Results in $OUT (default ./gpu-check-out): gpu-check.json, rewritten after every phase (a killed run leaves
# everything finished so far), gpu-check.log (all output, live), and the streamed run's trace and timeline.
# --dry-run walks every phase without a GPU (and without building), recording "no GPU" for each.
# Exit status 0 only when the build and every test suite passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=false
[ "${1:-}" = "--dry-run" ] && DRY=true
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
BUILD="${RP_GPU_BUILD:-$ROOT/build-gpu-check}"
JOBS="${RP_GPU_JOBS:-$(nproc)}"
BUDGET_S="${RP_GPU_BUDGET_S:-540}"
if [ -z "${RP_SHARED_DIR:-}" ]; then
  if [ -d "$ROOT/.gpu-carry/shared" ]; then RP_SHARED_DIR="$ROOT/.gpu-carry/shared"; else RP_SHARED_DIR="$ROOT/../shared"; fi
fi
export RP_SHARED_DIR
GTEST_SRC="${RP_GTEST_SOURCE_DIR:-$ROOT/.gpu-carry/googletest}"
MODELS="$RP_SHARED_DIR/models"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu-check.log"
JSON="$OUT_DIR/gpu-check.json"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
: > "$LOG"
start=$(date +%s)

log() { echo "$@" | tee -a "$LOG" >&2; }
jstr() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/ /g' | tr -d '\r' | tr '\n' ' ')"; }
elapsed() { echo $(( $(date +%s) - start )); }

# The fixed shares, in seconds of a 540 s budget, of each step, in the order they run (the steps of a phase
# are listed one by one). A step ends at the sum of the shares up to and including it.
SHARES=(build:130 kernel_tests:50 bench:15 synth:15 probe:40 resident:65 streamed:65 traced:10 peft_bench:45 peft_check:25
        hf_check:25 tests:35 sanitizer:20)
declare -A DEADLINE
acc=0
for sh in "${SHARES[@]}"; do
  acc=$(( acc + ${sh#*:} ))
  DEADLINE[${sh%%:*}]=$(( acc * BUDGET_S / 540 ))
done
# The seconds step $1 may still take (0 when its time is over).
until_end() { local l=$(( ${DEADLINE[$1]} - $(elapsed) )); [ "$l" -gt 0 ] && echo "$l" || echo 0; }
# run_for SECONDS CMD...: CMD under timeout, killed (SIGKILL) 5 s after its SIGTERM; rc 124 when it timed out.
run_for() { local t="$1"; shift; [ "$t" -ge 1 ] || return 124; timeout -k 5 "$t" "$@"; }

declare -A R
PHASES=(machine build kernel_tests bench probe finetune peft tests sanitizer)
ok=false
write_json() {
  {
    printf '{\n  "ok": %s,\n  "dry_run": %s,\n  "seconds": %s,\n  "budget_s": %s' "$ok" "$DRY" "$(( $(date +%s) - start ))" "$BUDGET_S"
    for p in "${PHASES[@]}"; do printf ',\n  "%s": %s' "$p" "${R[$p]:-null}"; done
    printf '\n}\n'
  } > "$JSON.tmp" && mv "$JSON.tmp" "$JSON"
}
no_gpu() { for p in "$@"; do R[$p]='{"skipped": "no GPU"}'; done; write_json; }

# ---- machine --------------------------------------------------------------------------------------------------
gpu=""; cap=""
if ! $DRY && command -v nvidia-smi > /dev/null; then
  gpu="$(run_for 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  cap="$(run_for 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')"
  run_for 20 nvidia-smi >> "$LOG" 2>&1
fi
kernel="$(uname -r)"
runtime=firecracker
case "$kernel" in 4.4.0*) runtime=gvisor ;; esac
if [ -z "$cap" ]; then
  log "gpu-check: no GPU ($($DRY && echo 'dry run' || echo 'nvidia-smi missing or silent')); every phase records \"no GPU\""
  R[machine]="{\"gpu\": null, \"kernel\": $(jstr "$kernel"), \"runtime\": \"$runtime\", \"skipped\": \"no GPU\"}"
  no_gpu build kernel_tests bench probe finetune peft tests sanitizer
  prev=0
  for sh in "${SHARES[@]}"; do
    n=${sh%%:*}
    log "$(printf 'plan: %-13s %4d s  (from %3d s to %3d s)' "$n" $(( ${DEADLINE[$n]} - prev )) "$prev" "${DEADLINE[$n]}")"
    prev=${DEADLINE[$n]}
  done
  $DRY && exit 0
  exit 1
fi
R[machine]="{\"gpu\": $(jstr "$gpu"), \"compute_cap\": \"$cap\", \"kernel\": $(jstr "$kernel"), \"runtime\": \"$runtime\", \"cores\": $(nproc)}"
log "gpu-check: $gpu (sm_$cap), $runtime ($kernel), build $BUILD, $JOBS jobs, budget ${BUDGET_S} s"
write_json

# ---- build ----------------------------------------------------------------------------------------------------
t0=$(date +%s)
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
build_ok=false
run_for "$(until_end build)" cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cap" \
  -DCMAKE_CXX_FLAGS=-g1 -DCMAKE_CUDA_FLAGS=-lineinfo \
  -DRP_WERROR=OFF -DRP_SHARED_DIR="$RP_SHARED_DIR" -DRP_GTEST_SOURCE_DIR="$GTEST_SRC" \
  -DRP_CLI11_INCLUDE_DIR="${RP_CLI11_INCLUDE_DIR:-$ROOT/.gpu-carry/cli11}" >> "$LOG" 2>&1
if [ $? -eq 0 ]; then
  run_for "$(until_end build)" cmake --build "$BUILD" -j "$JOBS" --target test_cuda test_quant rp-cuda-bench \
    rp-finetune rp-trace rp-gguf rp-tokenize ggml_rp_cuda >> "$LOG" 2>&1 && build_ok=true
fi
$build_ok || grep -E 'error|FAILED' "$LOG" | head -20 >&2
R[build]="{\"ok\": $build_ok, \"seconds\": $(( $(date +%s) - t0 )), \"arch\": \"sm_$cap\"}"
log "build: $build_ok ($(( $(date +%s) - t0 )) s)"
write_json
if ! $build_ok; then
  for p in kernel_tests bench probe finetune peft tests sanitizer; do R[$p]='{"skipped": "build failed"}'; done
  write_json
  exit 1
fi

# ---- tests: one process per suite ------------------------------------------------------------------------------
# run_suite PROGRAM SUITE SECONDS: appends the suite's JSON to $suites; returns 0 when it passed.
suites=""; tests_ok=true; n_pass=0; n_fail=0; n_skip=0
# The first failure of a GoogleTest log: the line that says where (": Failure", an exception, a signal, a
# CUDA error), never a [ RUN ] / [ OK ] / [ FAILED ] line (whose test names may contain "Error"), and the
# two lines after it (the message).
first_failure() {
  local where=': Failure$|^unknown file: Failure|thrown in the test body|what[(][)]|^terminate called|Segmentation fault|Aborted|^error: '
  awk -v re="$where" '/^\[/ { next } found { print; if (++n == 2) exit; next } $0 ~ re { print; found = 1 }' "$1" |
    tr '\n' ' ' | head -c 300
}
run_suite() {
  local prog="$1" suite="$2" t="$3" out="$SCRATCH/suite.txt" rc passed failed skipped last first bt ok=false
  run_for "$t" "$BUILD/tests/$prog" --gtest_filter="$suite.*" > "$out" 2>&1
  rc=$?
  cat "$out" >> "$LOG"
  passed=$(grep -cE '^\[       OK \]' "$out")
  failed=$(grep -cE '^\[  FAILED  \] [A-Za-z].*\(' "$out")
  skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z].*\(' "$out")
  last="$(grep -E '^\[ RUN      \]' "$out" | tail -1 | sed 's/^\[ RUN      \] //')"
  first="$(first_failure "$out")"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && ! grep -q 'skipped: no CUDA device' "$out"; then ok=true; fi
  { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && first="timed out after $t s; $first"
  # A crash (a signal other than the timeout's): the last test again under cuda-gdb, for the host backtrace.
  bt=""
  if [ "$rc" -gt 128 ] && [ "$rc" -ne 137 ] && [ -n "$last" ] && command -v cuda-gdb > /dev/null; then
    bt="$(run_for 30 cuda-gdb -batch -ex run -ex bt --args "$BUILD/tests/$prog" --gtest_filter="$last" 2>&1 |
          grep -E '^#[0-9]+ ' | head -12 | sed -e 's/ (.*) at / at /' | cut -c1-200)"
    log "$prog $last crashed; cuda-gdb backtrace:"; log "$bt"
  fi
  grep -q 'skipped: no CUDA device' "$out" && first="skipped without a usable GPU; $first"
  n_pass=$(( n_pass + passed )); n_fail=$(( n_fail + failed )); n_skip=$(( n_skip + skipped ))
  suites="$suites${suites:+, }{\"program\": \"$prog\", \"suite\": $(jstr "$suite"), \"ok\": $ok, \"rc\": $rc, \"passed\": $passed, \"failed\": $failed, \"skipped\": $skipped, \"last_run\": $(jstr "$last"), \"first_failure\": $(jstr "$first")${bt:+, \"backtrace\": $(jstr "$bt")}}"
  log "tests $prog $suite: $($ok && echo ok || echo FAILED) (rc $rc, $passed passed, $failed failed, $skipped skipped)${first:+ - $first}"
  $ok
}
list="$(run_for 30 "$BUILD/tests/test_cuda" --gtest_list_tests 2>>"$LOG" | grep -vE '^ |^Running' | sed 's/\.\s.*$//; s/\.$//')"
# The kernel suites run first (their figures decide whether anything else is worth reading); the rest later.
KERNEL_SUITES="CudaLaunch CudaArgs CudaOps CudaMatmul CudaAttention CudaCrossEntropy"
kernel_list=""; other_list=""
for suite in $list; do
  case " $KERNEL_SUITES " in *" $suite "*) kernel_list="$kernel_list $suite" ;; *) other_list="$other_list $suite" ;; esac
done
# run_suites KEY STEP PROGRAM:SUITE...: every suite within the step's time, the result in R[KEY].
run_suites() {
  local key="$1" step="$2" t0 tl entry; shift 2
  suites=""; tests_ok=true; n_pass=0; n_fail=0; n_skip=0; t0=$(date +%s)
  if [ -z "$list" ]; then
    tests_ok=false
    suites="{\"suite\": \"(list)\", \"ok\": false, \"first_failure\": \"test_cuda --gtest_list_tests listed nothing\"}"
    log "tests: test_cuda --gtest_list_tests listed nothing"
  fi
  for entry in "$@"; do
    tl=$(until_end "$step")
    if [ "$tl" -lt 5 ]; then
      log "$key: no time left for ${entry#*:}"; tests_ok=false
      suites="$suites${suites:+, }{\"suite\": $(jstr "${entry#*:}"), \"ok\": false, \"skipped\": \"no time left\"}"
      continue
    fi
    run_suite "${entry%%:*}" "${entry#*:}" "$tl" || tests_ok=false
    R[$key]="{\"ok\": $tests_ok, \"passed\": $n_pass, \"failed\": $n_fail, \"skipped\": $n_skip, \"suites\": [$suites]}"
    write_json
  done
  R[$key]="{\"ok\": $tests_ok, \"passed\": $n_pass, \"failed\": $n_fail, \"skipped\": $n_skip, \"seconds\": $(( $(date +%s) - t0 )), \"suites\": [$suites]}"
  write_json
  $tests_ok
}
kernel_entries=(); for suite in $kernel_list; do kernel_entries+=("test_cuda:$suite"); done
kernel_entries+=("test_quant:CudaDequant")
kernels_ok=false
run_suites kernel_tests kernel_tests "${kernel_entries[@]}" && kernels_ok=true
k_pass=$n_pass; k_fail=$n_fail; k_skip=$n_skip

# ---- bench ----------------------------------------------------------------------------------------------------
tl=$(until_end bench)
if [ "$tl" -ge 10 ] && run_for "$tl" "$BUILD/bin/rp-cuda-bench" "$SCRATCH/bench.json" 2>&1 | tee -a "$LOG" > /dev/null && [ -s "$SCRATCH/bench.json" ]; then
  R[bench]="$(cat "$SCRATCH/bench.json")"
else
  R[bench]="{\"ok\": false, \"error\": \"rp-cuda-bench failed or had no time ($tl s)\"}"
fi
write_json
peak=$(grep '"cublas_bf16_peak"' "$SCRATCH/bench.json" 2>/dev/null | sed -n 's/.*"tflops": \([0-9.]*\).*/\1/p' | sort -g | tail -1)
peak_src="rp-cuda-bench cublas_bf16_peak (random data)"
if [ -z "$peak" ]; then peak=788; peak_src="H200 bf16 GEMM on random data measured here (KINDS.md)"; fi

# ---- finetune: ours, resident and streamed ---------------------------------------------------------------------
FT_SEQ="${FT_SEQ:-512}"; FT_BATCH="${FT_BATCH:-8}"; FT_MICRO="${FT_MICRO:-4}"; FT_STEPS="${FT_STEPS:-4}"
FT_RANK=32; FT_ALPHA=16; FT_STREAM_MEM="${FT_STREAM_MEM:-4G}"
ft="$SCRATCH/ft"; mkdir -p "$ft"
model="$ft/qwen3-1.7b.gguf"
runs=""; params=""
median() { sort -g | awk '{v[NR]=$1} END {if (NR) print (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
# ours NAME DEVICES MEM SECONDS [flags]: one rp-finetune run; appends its JSON to runs.
ours() {
  local name="$1" n="$2" mem="$3" t="$4" rc tps first mfu=null okr=false t1 resident sent; shift 4
  t1=$(date +%s)
  if [ "$t" -lt 15 ]; then runs="$runs${runs:+, }\"$name\": {\"ok\": false, \"skipped\": \"no time left\"}"; return; fi
  run_for "$t" "$BUILD/bin/rp-finetune" -m "$model" --data "$ft/train.txt" -o "$ft/$name.gguf" --backend cuda --devices "$n" \
    --device-mem "$mem" --lora-rank "$FT_RANK" --lora-alpha "$FT_ALPHA" --seq-len "$FT_SEQ" --batch "$FT_BATCH" \
    --micro-batches "$FT_MICRO" --steps "$FT_STEPS" --lr 1e-4 --pin "$PIN" "$@" > "$ft/$name.txt" 2>&1
  rc=$?
  cat "$ft/$name.txt" >> "$LOG"
  tps=$(sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$ft/$name.gguf.metrics.jsonl" 2>/dev/null | tail -n +2 | median)
  first=$(sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$ft/$name.gguf.metrics.jsonl" 2>/dev/null | head -1)
  if [ "$rc" -eq 0 ] && [ -n "$tps" ]; then
    okr=true
    mfu=$(awk -v p="$params" -v t="$tps" -v k="$peak" 'BEGIN { printf "%.4f", 6 * p * t / (k * 1e12) }')
  fi
  # Whether the plan kept the frozen weights on the devices (memory_plan.h), and what each device was sent.
  resident=false; grep -q '^memory plan: .*resident frozen weights' "$ft/$name.txt" && resident=true
  sent=$(sed -n 's/^memory .*weights sent \([0-9]*\) bytes$/\1/p' "$ft/$name.txt" | awk '{s += $1} END {if (NR) print s}')
  log "finetune $name: rc $rc, $n x $mem, weights resident $resident, ${tps:-?} tok/s (median after step 1; step 1 ${first:-?}), MFU $mfu, $(( $(date +%s) - t1 )) s"
  runs="$runs${runs:+, }\"$name\": {\"ok\": $okr, \"rc\": $rc, \"devices\": $n, \"device_mem\": \"$mem\", \"weights_resident\": $resident, \"weight_bytes_sent\": ${sent:-null}, \"tokens_per_s\": ${tps:-null}, \"first_step_tokens_per_s\": ${first:-null}, \"mfu\": $mfu, \"pin\": \"$PIN\", \"pinning\": $(jstr "$(sed -n 's/^host: //p' "$ft/$name.txt" | head -1)"), \"last_line\": $(jstr "$(tail -n 1 "$ft/$name.txt" | cut -c1-300)"), \"error\": $(jstr "$(grep -m1 '^error' "$ft/$name.txt")")}"
}
# A small qwen3 with the real vocabulary (f32, 2 layers): the pinning probe's model and the cross-check's base.
synth_small() {
  run_for "$1" "$BUILD/bin/rp-gguf" synth "$2" --vocab "$MODELS/vocab/ggml-vocab-qwen2.gguf" --arch qwen3 --n-embd 256 \
    --n-head 4 --n-head-kv 2 --head-dim 64 --n-ff 512 --n-layer 2 --tied 1 --seed 3 >> "$LOG" 2>&1
}
# probe: each way of pinning the frozen weights on a small model; PIN becomes the first that trains (alloc if none).
PIN=alloc
probe_runs=""; probe_pin=""
small="$ft/small.gguf"
if [ "$(until_end synth)" -ge 5 ]; then
  t0=$(date +%s)
  params=$(run_for "$(until_end synth)" "$BUILD/bin/rp-gguf" synth "$model" --vocab "$MODELS/vocab/ggml-vocab-qwen2.gguf" \
             --shape qwen3-1.7b --type bf16 --seed 7 2>> "$LOG" | sed -n 's/^params //p')
  for i in $(seq 200); do cat "$MODELS/reference/train.txt"; done > "$ft/train.txt"
  if [ -n "$params" ]; then
    log "finetune: qwen3-1.7b-shaped bf16 model, $params parameters, written in $(( $(date +%s) - t0 )) s"
    if synth_small "$(until_end probe)" "$small"; then
      for mode in alloc register off; do
        tl=$(until_end probe); [ "$tl" -gt 13 ] && tl=13
        [ "$tl" -ge 5 ] || { probe_runs="$probe_runs${probe_runs:+, }\"$mode\": {\"skipped\": \"no time left\"}"; continue; }
        t1=$(date +%s)
        run_for "$tl" "$BUILD/bin/rp-finetune" -m "$small" --data "$MODELS/reference/train.txt" -o "$ft/probe-$mode.gguf" --seq-len 64 \
          --batch 2 --lora-rank 8 --steps 2 --backend cuda --devices 1 --device-mem 2G --pin "$mode" > "$ft/probe-$mode.txt" 2>&1
        rc=$?
        cat "$ft/probe-$mode.txt" >> "$LOG"
        log "probe --pin $mode: rc $rc in $(( $(date +%s) - t1 )) s; $(sed -n 's/^host: //p' "$ft/probe-$mode.txt" | head -1)"
        probe_runs="$probe_runs${probe_runs:+, }\"$mode\": {\"rc\": $rc, \"seconds\": $(( $(date +%s) - t1 )), \"pinning\": $(jstr "$(sed -n 's/^host: //p' "$ft/probe-$mode.txt" | head -1)"), \"last_line\": $(jstr "$(tail -n 1 "$ft/probe-$mode.txt" | cut -c1-300)")}"
        [ "$rc" -eq 0 ] && [ -z "$probe_pin" ] && probe_pin=$mode
      done
    fi
    PIN=${probe_pin:-alloc}
    R[probe]="{\"chosen\": \"$PIN\", \"runs\": {$probe_runs}}"
    write_json
    ours resident 1 80G "$(until_end resident)"
    ours streamed 4 "$FT_STREAM_MEM" "$(until_end streamed)" --resident-weights off
    # The timeline from a short traced run (--trace adds a host callback per operation: never the timed run).
    tt=$(until_end traced)
    if [ "$tt" -ge 8 ]; then
      run_for "$tt" "$BUILD/bin/rp-finetune" -m "$model" --data "$ft/train.txt" -o "$ft/traced.gguf" --backend cuda --devices 4 \
        --device-mem "$FT_STREAM_MEM" --lora-rank "$FT_RANK" --lora-alpha "$FT_ALPHA" --seq-len "$FT_SEQ" --batch "$FT_BATCH" \
        --micro-batches "$FT_MICRO" --steps 1 --lr 1e-4 --pin "$PIN" --resident-weights off --trace "$ft/streamed.trace.json" >> "$LOG" 2>&1
    fi
    if [ -s "$ft/streamed.trace.json" ]; then
      cp "$ft/streamed.trace.json" "$OUT_DIR/finetune-streamed.trace.json"
      run_for 30 "$BUILD/bin/rp-trace" "$ft/streamed.trace.json" -o "$OUT_DIR/finetune-streamed.timeline.svg" \
        --title "Qwen3-1.7B shape, LoRA r32, 4 logical CUDA devices x $FT_STREAM_MEM" >> "$LOG" 2>&1
    fi
    R[finetune]="{\"model\": \"qwen3-1.7b shape, bf16, random\", \"params\": $params, \"seq_len\": $FT_SEQ, \"batch\": $FT_BATCH, \"micro_batches\": $FT_MICRO, \"steps\": $FT_STEPS, \"lora_rank\": $FT_RANK, \"peak_tflops\": $peak, \"peak_source\": $(jstr "$peak_src"), $runs}"
  else
    R[finetune]='{"ok": false, "error": "rp-gguf synth failed"}'
  fi
else
  R[finetune]='{"skipped": "no time left"}'
fi
write_json

# ---- peft: the peer, and the cross-check of our numbers -------------------------------------------------------
peft_json="null"; check_json="null"
tl=$(until_end peft_bench)
if [ "$tl" -ge 20 ] && [ -n "$params" ]; then
  PYTHONUNBUFFERED=1 run_for "$tl" python3 "$ROOT/bench/gpu/peft_baseline.py" bench --shape qwen3-1.7b \
    --vocab-size 151936 --seq-len "$FT_SEQ" --batch "$FT_BATCH" --micro-batches "$FT_MICRO" --steps "$FT_STEPS" \
    --rank "$FT_RANK" --alpha "$FT_ALPHA" --json "$SCRATCH/peft.json" 2>&1 | tee -a "$LOG" > /dev/null
  [ -s "$SCRATCH/peft.json" ] && peft_json="$(cat "$SCRATCH/peft.json")"
fi
tl=$(until_end peft_check)
if [ "$tl" -ge 15 ]; then
  # The same weights through both engines: a small qwen3 with the real vocabulary, f32, LoRA made non-zero by two
  # steps, then one more step with lr 0 whose batch, logits, loss and gradients rp-finetune dumps.
  c="$SCRATCH/check"; mkdir -p "$c"
  if [ -s "$small" ]; then cp "$small" "$c/base.gguf"; else synth_small "$(until_end peft_check)" "$c/base.gguf"; fi
  common=(-m "$c/base.gguf" --data "$MODELS/reference/train.txt" --seq-len 64 --batch 2 --backend cuda --devices 1
          --device-mem 2G --lora-rank 8 --lora-alpha 16 --attention-type f32 --f32-gemm f32 --clip 0 --pin "$PIN")
  run_for "$(until_end peft_check)" "$BUILD/bin/rp-finetune" "${common[@]}" --steps 2 --lr 1e-2 -o "$c/a1.gguf" >> "$LOG" 2>&1 &&
  run_for "$(until_end peft_check)" "$BUILD/bin/rp-finetune" "${common[@]}" --resume "$c/a1.gguf" --steps 1 --lr 0 --dump-grads "$c/step.gguf" -o "$c/a2.gguf" >> "$LOG" 2>&1 &&
  PYTHONUNBUFFERED=1 run_for "$(until_end peft_check)" python3 "$ROOT/bench/gpu/peft_baseline.py" check --base "$c/base.gguf" \
    --adapter "$c/a1.gguf" --dump "$c/step.gguf" --json "$SCRATCH/check.json" 2>&1 | tee -a "$LOG" > /dev/null
  [ -s "$SCRATCH/check.json" ] && check_json="$(cat "$SCRATCH/check.json")"
fi
hf_json="null"
tl=$(until_end hf_check)
if [ "$tl" -ge 15 ]; then
  run_for "$tl" bash "$ROOT/bench/gpu/hf_cases.sh" "$BUILD/bin" "$MODELS" "$SCRATCH/hf" >> "$LOG" 2>&1
  cases=()
  for d in "$SCRATCH"/hf/*/; do [ -s "$d/step.gguf" ] && [ -d "$d/peft" ] && cases+=("${d%/}"); done
  if [ ${#cases[@]} -gt 0 ]; then
    PYTHONUNBUFFERED=1 run_for "$(until_end hf_check)" python3 "$ROOT/bench/gpu/peft_baseline.py" hf "${cases[@]}" \
      --json "$SCRATCH/hf.json" 2>&1 | tee -a "$LOG" > /dev/null
    [ -s "$SCRATCH/hf.json" ] && hf_json="$(cat "$SCRATCH/hf.json")"
  else
    hf_json='{"ok": false, "error": "bench/gpu/hf_cases.sh made no case (see the log)"}'
  fi
fi
R[peft]="{\"bench\": $peft_json, \"check\": $check_json, \"hf\": $hf_json}"
write_json

# ---- tests: the remaining suites -------------------------------------------------------------------------------
other_entries=(); for suite in $other_list; do other_entries+=("test_cuda:$suite"); done
others_ok=false
if [ ${#other_entries[@]} -gt 0 ]; then run_suites tests tests "${other_entries[@]}" && others_ok=true; else R[tests]='{"ok": true, "suites": []}'; others_ok=true; fi
n_pass=$(( n_pass + k_pass )); n_fail=$(( n_fail + k_fail )); n_skip=$(( n_skip + k_skip ))
tests_ok=false; $kernels_ok && $others_ok && tests_ok=true
$tests_ok && ok=true
write_json

# ---- sanitizer --------------------------------------------------------------------------------------------------
tl=$(until_end sanitizer)
if [ "$tl" -ge 15 ] && command -v compute-sanitizer > /dev/null; then
  s="$SCRATCH/san"; mkdir -p "$s"
  run_for "$tl" compute-sanitizer --tool memcheck --error-exitcode 2 --print-limit 20 "$BUILD/bin/rp-finetune" \
    -m "$MODELS/stories260K.gguf" --data "$MODELS/reference/train.txt" -o "$s/a.gguf" --steps 1 --seq-len 32 --batch 4 \
    --micro-batches 2 --backend cuda --devices 2 --device-mem 256M > "$s/log" 2>&1
  rc=$?
  head -c 200000 "$s/log" >> "$LOG"
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$s/log" | tail -1)
  note=""
  grep -qi "not supported\|Device not supported" "$s/log" && note="compute-sanitizer refused the device (expected on gVisor)"
  R[sanitizer]="{\"tool\": \"memcheck\", \"runtime\": \"$runtime\", \"rc\": $rc, \"errors\": ${errors:-null}, \"note\": $(jstr "$note"), \"first\": $(jstr "$(grep -m1 -E 'Invalid|ERROR' "$s/log")")}"
else
  R[sanitizer]="{\"skipped\": \"$( command -v compute-sanitizer > /dev/null && echo 'no time left' || echo 'no compute-sanitizer' )\"}"
fi
write_json

# ---- summary --------------------------------------------------------------------------------------------------
{
  echo "== gpu-check summary: $gpu (sm_$cap, $runtime), $(( $(date +%s) - start )) s"
  printf '%-44s %s\n' "build" "$build_ok"
  printf '%-44s %s (%s passed, %s failed, %s skipped)\n' "tests" "$tests_ok" "$n_pass" "$n_fail" "$n_skip"
  echo "${R[kernel_tests]} ${R[tests]}" | grep -o '"suite": "[^"]*", "ok": false' | sed 's/"suite": "\([^"]*\)".*/  failed suite: \1/'
  if [ -s "$SCRATCH/bench.json" ]; then
    sed -n 's/.*"name": "\([^"]*\)", "shape": "\([^"]*\)".*"tflops": \([0-9.]*\).*/\1 \2 \3/p' "$SCRATCH/bench.json" |
      awk '{t=$NF; $NF=""; printf "%-44s %8.1f TFLOP/s\n", $0, t}'
  fi
  for r in resident streamed; do
    tps=$(echo "${R[finetune]}" | sed -n "s/.*\"$r\": {[^}]*\"tokens_per_s\": \([0-9.null]*\).*/\1/p")
    mfu=$(echo "${R[finetune]}" | sed -n "s/.*\"$r\": {[^}]*\"mfu\": \([0-9.null]*\).*/\1/p")
    wres=$(echo "${R[finetune]}" | sed -n "s/.*\"$r\": {[^}]*\"weights_resident\": \([a-z]*\).*/\1/p")
    printf '%-44s %s tok/s, MFU %s, frozen weights resident: %s\n' "ours LoRA $r" "${tps:-?}" "${mfu:-?}" "${wres:-?}"
  done
  ptps=$(echo "$peft_json" | sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p')
  printf '%-44s %s tok/s\n' "transformers + PEFT LoRA (same shape)" "${ptps:-?}"
  rtps=$(echo "${R[finetune]}" | sed -n 's/.*"resident": {[^}]*"tokens_per_s": \([0-9.]*\).*/\1/p')
  if [ -n "$ptps" ] && [ -n "$rtps" ]; then printf '%-44s %s\n' "ours (resident) / PEFT" "$(awk -v a="$rtps" -v b="$ptps" 'BEGIN {printf "%.2f", a / b}')"; fi
  echo "pinning probe: ${R[probe]:-null}"
  echo "cross-check vs transformers: $check_json"
  echo "sanitizer: ${R[sanitizer]}"
} 2>&1 | tee -a "$LOG" >&2
write_json
log "gpu-check: $JSON"
$ok
