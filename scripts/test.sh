#!/usr/bin/env bash
# The README's test command: installs dependencies, fetches the llama.cpp oracle, builds the CPU build (warnings are errors) and runs every
# test with CTest. BUILD_DIR overrides the build folder (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# llama.cpp's prebuilt CPU libraries from npm: the reference oracle for logits and tokens (test-only).
bash scripts/fetch-oracle.sh .oracle
BUILD_DIR=${BUILD_DIR:-build}
# CTest runs one test per core at once, and most tests run OpenMP on every core: threads that spin at barriers
# (libgomp's default) starve the other test's. Sleeping at once is quickest then (two preference training tests side
# by side under ASan: 94 / 92 s spinning, 32 / 29 s with the tools' GOMP_SPINCOUNT=10000, 24 / 21 s passive).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRP_WERROR=ON -DRP_CUDA=OFF ${RP_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" ${CTEST_ARGS:-}
