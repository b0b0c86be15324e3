#!/usr/bin/env bash
# Fuzzes the GGUF reader for SECONDS: tests/fuzz/run.sh BUILD_DIR SECONDS
# BUILD_DIR is a clang build configured with -DRP_FUZZ=ON and target fuzz_gguf_reader built. The corpus
# is seeded with small generated files and the shared models under 2 MB (libFuzzer reads at most -max_len
# bytes of each). Exits non-zero when the fuzzer finds a crash; the input is saved under
# BUILD_DIR/fuzz/artifacts/.
set -euo pipefail
BUILD=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
SECONDS_TO_RUN=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SHARED=${RP_SHARED_DIR:-$REPO/../shared}
BUILD=$(cd "$BUILD" && pwd)
FUZZER=$BUILD/bin/fuzz_gguf_reader

if [ ! -x "$FUZZER" ]; then
  echo "run.sh: $FUZZER is missing: configure with clang and -DRP_FUZZ=ON, build target fuzz_gguf_reader" >&2
  exit 2
fi
cmake --build "$BUILD" --target fuzz_gguf_seeds >/dev/null

SEEDS=$BUILD/fuzz/seeds
CORPUS=$BUILD/fuzz/corpus
ARTIFACTS=$BUILD/fuzz/artifacts
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$CORPUS" "$ARTIFACTS"
"$BUILD/bin/fuzz_gguf_seeds" "$SEEDS"
if [ -d "$SHARED/models" ]; then
  find "$SHARED/models" -name '*.gguf' -size -2048k -print0 |
    while IFS= read -r -d '' f; do cp "$f" "$SEEDS/shared-$(basename "$f")"; done
else
  echo "run.sh: $SHARED/models not found; fuzzing from generated seeds only" >&2
fi
echo "run.sh: $(ls "$SEEDS" | wc -l) seeds, fuzzing for $SECONDS_TO_RUN s"

# New inputs go to the first directory (CORPUS), which persists between runs.
"$FUZZER" "$CORPUS" "$SEEDS" -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -rss_limit_mb=2048 \
  -artifact_prefix="$ARTIFACTS/" -print_final_stats=1
