#!/usr/bin/env bash
# Long fuzzing: every target (or the ones named) for HOURS in total, in rounds of ROUND seconds each
# (default 600) so that every target gets time early and the corpora grow together; stops at the first
# crash (run.sh keeps the input under BUILD_DIR/fuzz/<target>/artifacts/).
#   tests/fuzz/long.sh BUILD_DIR HOURS [TARGET ...]        env: ROUND (seconds per target per round)
set -euo pipefail
BUILD=${1:?usage: tests/fuzz/long.sh BUILD_DIR HOURS [TARGET ...]}
HOURS=${2:?usage: tests/fuzz/long.sh BUILD_DIR HOURS [TARGET ...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_reader json dataset chat_template tokenizer)
round=${ROUND:-600}
HERE=$(cd "$(dirname "$0")" && pwd)
end=$(( $(date +%s) + $(awk -v h="$HOURS" 'BEGIN {printf "%d", h * 3600}') ))
n=0
while [ "$(date +%s)" -lt "$end" ]; do
  n=$((n + 1))
  echo "long.sh: round $n ($(date -u +%H:%M:%S))"
  bash "$HERE/run.sh" "$BUILD" "$round" "${targets[@]}"
done
echo "long.sh: $n rounds of ${round} s per target, no crash"
