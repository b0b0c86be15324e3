#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input for SECONDS each:
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET ...]
# TARGETs: gguf_reader json dataset chat_template tokenizer safetensors (default: all). BUILD_DIR is a clang build
# configured with -DRP_FUZZ=ON with target fuzz_targets built. Each target keeps its corpus under
# BUILD_DIR/fuzz/<target>/corpus (persisting between runs, seeded with small generated inputs and, for the
# GGUF reader, the shared models under 2 MB); a crashing input is saved under BUILD_DIR/fuzz/<target>/artifacts/
# and the script exits non-zero. The targets run side by side, one per core (FUZZ_JOBS overrides). Prints each
# target's executions, and a summary line per target.
set -euo pipefail
BUILD=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET ...]}
SECONDS_TO_RUN=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET ...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_reader json dataset chat_template tokenizer safetensors)
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SHARED=${RP_SHARED_DIR:-$REPO/../shared}
BUILD=$(cd "$BUILD" && pwd)

seed() {  # DIR NAME BYTES (printf format)
  printf "$3" >"$1/$2"
}

seeds_for() {  # TARGET DIR
  local t=$1 dir=$2
  case $t in
    gguf_reader)
      cmake --build "$BUILD" --target fuzz_gguf_seeds >/dev/null
      "$BUILD/bin/fuzz_gguf_seeds" "$dir"
      if [ -d "$SHARED/models" ]; then
        find "$SHARED/models" -name '*.gguf' -size -2048k -print0 |
          while IFS= read -r -d '' f; do cp "$f" "$dir/shared-$(basename "$f")"; done
      fi ;;
    json)
      seed "$dir" obj '{"text": "Once upon a time", "n": -1.5e-3, "ok": true, "none": null}'
      seed "$dir" arr '[1, 2.5e3, "x\\u00e9\\ud83d\\ude00", [], {}, [[["deep"]]], false]'
      seed "$dir" chat '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
      seed "$dir" esc '"\\\\ \\" \\/ \\b \\f \\n \\r \\t"' ;;
    dataset)
      seed "$dir" text '\x10Once upon a time there was a girl.\n\nThe end.\n'
      seed "$dir" jsonl '\x08{"text": "a b c d e f"}\n{"prompt": "2+2=", "completion": "4"}\n'
      seed "$dir" chat '\x20{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
      seed "$dir" pairs '\x18{"prompt": "Once", "chosen": " a dog.", "rejected": " a cat."}\n{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yo"}], "rejected": [{"role": "assistant", "content": "no"}]}\n'
      seed "$dir" kto '\x18{"prompt": "Once", "completion": " a dog.", "label": true}\n{"prompt": "Then", "completion": " a cat.", "label": false}\n' ;;
    chat_template)
      seed "$dir" turns '\x00You are kind.\xff\x01Hello?\xff\x02Hi there.\xff\x01Bye\xff\x02Bye!'
      seed "$dir" markers '\x01<|im_start|>user\xff\x02<|eot_id|>\xff' ;;
    tokenizer)
      local i=0
      for inp in "$SHARED"/models/vocab/*.inp; do
        [ -f "$inp" ] || continue
        awk -v dir="$dir" -v base="$(basename "$inp")" 'BEGIN { RS = "\n__ggml_vocab_test__\n"; n = 0 }
          { f = dir "/" base "-" n++; printf "%s", $0 > f; close(f) }' "$inp"
        i=$((i + 1))
      done
      seed "$dir" plain 'Hello world! 123 \xc3\xa9t\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd' ;;
    safetensors)
      # an 8-byte length, the JSON header, the tensors' bytes
      seed "$dir" one '\x38\x00\x00\x00\x00\x00\x00\x00{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  \x00\x00\x80\x3f'
      seed "$dir" two '\x58\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}\x80\x3f\x00\x40' ;;
    *) echo "run.sh: unknown target '$t' (gguf_reader json dataset chat_template tokenizer safetensors)" >&2; exit 2 ;;
  esac
}

# One target: its seeds, then the fuzzer for SECONDS_TO_RUN; what it printed in $work/out, its summary line in
# $work/summary, 1 in $work/failed when it found a crash.
fuzz_one() {
  local t=$1 FUZZER=$BUILD/bin/fuzz_$1 work=$BUILD/fuzz/$1 rc=0 execs log
  rm -rf "$work/seeds" "$work/failed"
  mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"
  seeds_for "$t" "$work/seeds"
  # Inputs that once broke a target's invariants stay in the repository as seeds (tests/fuzz/corpus/<target>/).
  if [ -d "$HERE/corpus/$t" ]; then cp "$HERE/corpus/$t"/* "$work/seeds/"; fi
  {
    echo "run.sh: fuzz_$t: $(ls "$work/seeds" | wc -l) seeds, $(ls "$work/corpus" | wc -l) corpus inputs, $SECONDS_TO_RUN s"
    log=$work/last.log
    # New inputs go to the first directory (the corpus), which persists between runs.
    "$FUZZER" "$work/corpus" "$work/seeds" -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -rss_limit_mb=2048 \
      -artifact_prefix="$work/artifacts/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    tail -3 "$log" | grep -v '^$' || true
    if [ $rc -ne 0 ]; then
      echo "run.sh: fuzz_$t FAILED (exit $rc); input saved under $work/artifacts/:"
      grep -E "ERROR|SUMMARY|Test unit written" "$log" || tail -30 "$log"
      echo 1 > "$work/failed"
    fi
    echo "fuzz_$t: ${execs:-?} executions in $SECONDS_TO_RUN s, $( [ $rc -eq 0 ] && echo "0 crashes" || echo "a crash (exit $rc)" )" > "$work/summary"
  } > "$work/out" 2>&1
}

for t in "${targets[@]}"; do
  if [ ! -x "$BUILD/bin/fuzz_$t" ]; then
    echo "run.sh: $BUILD/bin/fuzz_$t is missing: configure with clang and -DRP_FUZZ=ON, build target fuzz_targets" >&2
    exit 2
  fi
  case $t in
    gguf_reader | json | dataset | chat_template | tokenizer | safetensors) ;;
    *) echo "run.sh: unknown target '$t' (gguf_reader json dataset chat_template tokenizer safetensors)" >&2; exit 2 ;;
  esac
done
# The targets side by side, FUZZ_JOBS at a time (default: one per core; each fuzzer is one thread), so the
# wall time is the per-target time times targets / cores.
jobs=${FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do cat "$BUILD/fuzz/$t/out"; [ -f "$BUILD/fuzz/$t/failed" ] && status=1; done
for t in "${targets[@]}"; do cat "$BUILD/fuzz/$t/summary" 2>/dev/null || { echo "fuzz_$t: did not finish"; status=1; }; done
exit $status
