#!/usr/bin/env bash
# gpu-prep.sh: prepares the one device call that runs tools/gpu-check.sh on a GPU machine, here, without a GPU.
#
# The GPU machine has CUDA, CMake, ninja and PyTorch/transformers/PEFT, but no GoogleTest or CLI11, and the ../shared
# folder beside this checkout does not travel with it. This script copies what the check needs into one folder
# of the repository that git ignores (.git/info/exclude), checks that the working tree plus that folder stay
# well under the device tool's 64 MiB, and prints the device call to make:
#   .gpu-carry/googletest/      GoogleTest's sources (Debian's googletest package, /usr/src/googletest); the CMake
#                               build compiles them when the system has no GoogleTest (tests/CMakeLists.txt)
#   .gpu-carry/cli11/CLI/       CLI11's headers (Debian's libcli11-dev, /usr/include/CLI), found by CMakeLists.txt
#   .gpu-carry/shared/models/   the test models the CUDA tests and the GPU benchmarks read (stories260K, the
#                               synthetic qwen2/qwen3 files, the vocabularies, reference/train.txt)
#
#   tools/gpu-prep.sh [--carry DIR] [--quiet]      DIR defaults to .gpu-carry (relative to the repository)
# Exit status 1, with a message, when a source is missing or the carry is too large.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY=.gpu-carry
QUIET=false
while [ $# -gt 0 ]; do
  case "$1" in
    --carry) CARRY="${2:?--carry needs a folder}"; shift 2 ;;
    --quiet) QUIET=true; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu-prep: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
SHARED="${RP_SHARED_DIR:-$ROOT/../shared}"
GTEST_SRC="${RP_GTEST_SOURCES:-/usr/src/googletest}"
CLI11_SRC="${RP_CLI11_HEADERS:-/usr/include/CLI}"
LIMIT_MIB=64
BUDGET_MIB=48   # leave room: the tool counts the whole working tree
die() { echo "gpu-prep: $*" >&2; exit 1; }

[ -f "$GTEST_SRC/CMakeLists.txt" ] || die "no GoogleTest sources at $GTEST_SRC (apt-get install googletest, or set RP_GTEST_SOURCES)"
[ -f "$CLI11_SRC/CLI.hpp" ] || die "no CLI11 headers at $CLI11_SRC (apt-get install libcli11-dev, or set RP_CLI11_HEADERS)"
[ -f "$SHARED/models/stories260K.gguf" ] || die "no test models at $SHARED/models (set RP_SHARED_DIR)"

cd "$ROOT"
case "$CARRY" in /*) dest="$CARRY" ;; *) dest="$ROOT/$CARRY" ;; esac
rm -rf "$dest"
mkdir -p "$dest/shared"
cp -r "$GTEST_SRC" "$dest/googletest"
rm -rf "$dest/googletest/googlemock"   # tests/CMakeLists.txt builds googletest only (BUILD_GMOCK=OFF)
mkdir -p "$dest/cli11"
cp -r "$CLI11_SRC" "$dest/cli11/CLI"
# Every model file but the deliberately broken ones (the GGUF reader's tests, which run on the CPU).
mkdir -p "$dest/shared/models"
for f in "$SHARED"/models/*; do
  case "$(basename "$f")" in invalid) continue ;; esac
  cp -r "$f" "$dest/shared/models/"
done
chmod -R u+w "$dest"
for need in stories260K.gguf synthetic/tiny-random-qwen2.gguf synthetic/tiny-random-qwen3.gguf vocab/ggml-vocab-qwen2.gguf \
            vocab/ggml-vocab-llama-spm.gguf vocab/ggml-vocab-llama-bpe.gguf reference/train.txt; do
  [ -f "$dest/shared/models/$need" ] || die "the carry lacks shared/models/$need"
done

# Ignored by git (so it is neither committed nor sent twice), carried by the device call.
if [ -d "$ROOT/.git" ] && [ "${dest#$ROOT/}" != "$dest" ]; then
  rel="/${dest#$ROOT/}/"
  grep -qxF "$rel" "$ROOT/.git/info/exclude" 2>/dev/null || echo "$rel" >> "$ROOT/.git/info/exclude"
fi

carry_kib=$(du -sk "$dest" | cut -f1)
tree_kib=0
if command -v git > /dev/null && [ -d "$ROOT/.git" ]; then
  tree_kib=$(git -C "$ROOT" ls-files -z --cached --others --exclude-standard | xargs -0 -r du -sk 2>/dev/null | awk '{s += $1} END {print s + 0}')
fi
total_mib=$(( (carry_kib + tree_kib + 1023) / 1024 ))
[ "$total_mib" -le "$BUDGET_MIB" ] || die "working tree ${tree_kib} KiB + carry ${carry_kib} KiB = ${total_mib} MiB exceeds ${BUDGET_MIB} MiB (the device tool takes ${LIMIT_MIB})"

rel_carry="${dest#$ROOT/}"
if [ "$rel_carry" = "$dest" ]; then ref="$dest"; else ref="\$PWD/$rel_carry"; fi  # the device runs in the repository root
cmd="RP_SHARED_DIR=$ref/shared RP_GTEST_SOURCE_DIR=$ref/googletest RP_CLI11_INCLUDE_DIR=$ref/cli11 bash tools/gpu-check.sh"
if ! $QUIET; then
  echo "gpu-prep: carry $rel_carry: ${carry_kib} KiB (GoogleTest sources, CLI11 headers, test models); with the working tree ${total_mib} MiB of ${LIMIT_MIB}"
  echo "gpu-prep: the device call (one run; gpu-check.sh keeps within its 540 s budget and rewrites \$OUT/gpu-check.json after every phase):"
fi
printf '{"command": "%s", "carry": ["%s"], "timeout_s": 600}\n' "$cmd" "$rel_carry"
