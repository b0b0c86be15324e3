#!/usr/bin/env bash
# Installs what ggml-rp needs to build and test on a fresh Debian/Ubuntu machine (idempotent; run as root or
# with sudo). CUDA is optional and not installed here: when nvcc is present the CUDA sources build too.
set -euo pipefail
need=()
# Open MPI: data-parallel training between processes (mpirun; optional in CMake: RP_MPI). librsvg2-bin:
# rsvg-convert, which a test renders the loss curve with. libcli11-dev: the tools' option parser (header-only).
for pkg in cmake ninja-build g++ clang libgtest-dev libopenblas-dev libomp-dev libopenmpi-dev openmpi-bin git time bc python3 librsvg2-bin libcli11-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# npm (for the test-only llama.cpp oracle) may come with a nodejs package from another source: only install
# Debian's when no npm is on the PATH.
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
