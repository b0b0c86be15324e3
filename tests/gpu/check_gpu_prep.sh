#!/usr/bin/env bash
# The GPU check can run on a machine that has neither GoogleTest nor ../shared (tools/gpu-prep.sh,
# tools/gpu-check.sh), checked here without a GPU:
#   - gpu-prep.sh writes a carry folder with GoogleTest's sources and the test models, under the size limit,
#     and prints the device call (command, carry, timeout_s);
#   - a build configures from that carry with the system's GoogleTest hidden, and compiles GoogleTest from it;
#   - gpu-check.sh --dry-run walks every phase and writes a JSON that says "no GPU" for each.
#   check_gpu_prep.sh SOURCE_DIR SHARED_DIR
set -euo pipefail
src=${1:?usage: check_gpu_prep.sh SOURCE_DIR SHARED_DIR}
shared=${2:?usage: check_gpu_prep.sh SOURCE_DIR SHARED_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

call=$(RP_SHARED_DIR="$shared" bash "$src/tools/gpu-prep.sh" --carry "$tmp/carry" --quiet)
echo "$call"
echo "$call" | grep -q '"command": ".*tools/gpu-check.sh"' || fail "no command in: $call"
echo "$call" | grep -q '"carry": \["' || fail "no carry in: $call"
echo "$call" | grep -q '"timeout_s": 600' || fail "no timeout in: $call"
for f in googletest/CMakeLists.txt googletest/googletest/src/gtest-all.cc shared/models/stories260K.gguf \
         shared/models/vocab/ggml-vocab-qwen2.gguf shared/models/vocab/ggml-vocab-llama-spm.gguf shared/models/vocab/ggml-vocab-llama-bpe.gguf \
         shared/models/synthetic/tiny-random-qwen3.gguf shared/models/reference/train.txt; do
  [ -f "$tmp/carry/$f" ] || fail "the carry lacks $f"
done
kib=$(du -sk "$tmp/carry" | cut -f1)
[ "$kib" -lt $((40 * 1024)) ] || fail "the carry is $kib KiB"
echo "ok: carry of $kib KiB"

gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$src" -B "$tmp/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRP_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
  -DRP_GTEST_SOURCE_DIR="$tmp/carry/googletest" -DRP_SHARED_DIR="$tmp/carry/shared" > "$tmp/cfg.log" 2>&1 ||
  { cat "$tmp/cfg.log" >&2; fail "configure from the carry failed"; }
grep -q "GoogleTest built from $tmp/carry/googletest" "$tmp/cfg.log" || fail "the build did not use the carried GoogleTest"
cmake --build "$tmp/build" --target gtest_main -j 2 > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log" >&2; fail "GoogleTest from the carry does not compile"; }
echo "ok: configured and compiled GoogleTest from the carry with the system's hidden"

OUT="$tmp/out" RP_SHARED_DIR="$tmp/carry/shared" bash "$src/tools/gpu-check.sh" --dry-run > "$tmp/dry.log" 2>&1 ||
  { cat "$tmp/dry.log" >&2; fail "gpu-check.sh --dry-run failed"; }
j="$tmp/out/gpu-check.json"
[ -s "$j" ] || fail "no $j"
grep -q '"dry_run": true' "$j" || fail "not marked as a dry run: $(cat "$j")"
for phase in machine build kernel_tests bench probe finetune peft tests sanitizer; do
  grep -q "\"$phase\": {[^}]*\"skipped\": \"no GPU\"" "$j" || fail "phase $phase does not say \"no GPU\": $(cat "$j")"
done
[ -s "$tmp/out/gpu-check.log" ] || fail "no log"
# The plan: the headline figures first (build, kernel tests, the finetunes, the peer), then the other suites and
# the sanitizer; every share positive and the last one ending at the budget.
order=$(sed -n 's/^plan: \([a-z_]*\) .*/\1/p' "$tmp/out/gpu-check.log" | tr '\n' ' ')
[ "$order" = "build kernel_tests bench synth probe resident streamed traced peft_bench peft_check hf_check tests sanitizer " ] ||
  fail "the phase order is '$order'"
sed -n 's/^plan: [a-z_]* *\([0-9]*\) s.*/\1/p' "$tmp/out/gpu-check.log" | while read -r sec; do [ "$sec" -gt 0 ] || fail "a share of $sec s"; done
grep -q '^plan: sanitizer .* to 540 s)$' "$tmp/out/gpu-check.log" || fail "the shares do not end at the budget: $(grep '^plan' "$tmp/out/gpu-check.log")"
grep -q 'timeout -k' "$src/tools/gpu-check.sh" || fail "gpu-check.sh runs nothing under timeout -k"
echo "ok: gpu-check.sh --dry-run plan: $order"

# first_failure reads GoogleTest's failure lines, never a test's name (names such as ...ErrorPoisonsItsStream).
eval "$(sed -n '/^first_failure() {/,/^}/p' "$src/tools/gpu-check.sh")"
printf '%s\n' '[ RUN      ] CudaDevice.ALauncherArgumentErrorPoisonsItsStream' \
  '[       OK ] CudaDevice.ALauncherArgumentErrorPoisonsItsStream (3 ms)' '[ RUN      ] CudaOps.Softmax' \
  'test_ops.cpp:150: Failure' 'Expected: nmse < 1e-6' '  Actual: 0.5' 'more' '[  FAILED  ] CudaOps.Softmax (1 ms)' > "$tmp/g.txt"
got=$(first_failure "$tmp/g.txt")
[ "$got" = "test_ops.cpp:150: Failure Expected: nmse < 1e-6   Actual: 0.5 " ] || fail "first_failure gave '$got'"
printf '%s\n' '[ RUN      ] CudaDevice.SomeErrorTest' '[  FAILED  ] CudaDevice.SomeErrorTest (1 ms)' > "$tmp/g2.txt"
[ -z "$(first_failure "$tmp/g2.txt")" ] || fail "first_failure matched a test name: '$(first_failure "$tmp/g2.txt")'"
echo "ok: first_failure"

# The peer's JSON has no NaN (which JSON does not have): non-finite numbers become null.
got=$(python3 -B -c "import json, sys; sys.path.insert(0, '$src/bench/gpu'); import peft_baseline as p
print(json.dumps(p.finite_or_null({'loss': float('nan'), 'g': [float('inf'), 1.5, {'x': -float('inf')}], 'n': 2}), allow_nan=False))")
[ "$got" = '{"loss": null, "g": [null, 1.5, {"x": null}], "n": 2}' ] || fail "finite_or_null gave $got"
echo "ok: peft_baseline.py writes null for NaN"
echo "ok: gpu-check.sh --dry-run: $(tr -d '\n' < "$j" | head -c 300)"
