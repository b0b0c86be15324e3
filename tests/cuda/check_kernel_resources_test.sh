#!/usr/bin/env bash
# The kernel-resource checker (check_kernel_resources.sh) on ptxas logs written here: a log within every limit
# passes; 256 registers, 48 KiB + 1 of static shared memory, or an architecture missing a kernel each fail,
# naming the kernel and the architecture. Runs without nvcc.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
entry() {  # NAME ARCH REGS SMEM
  printf "ptxas info    : Compiling entry function '%s' for 'sm_%s'\n" "$1" "$2"
  printf "ptxas info    : Function properties for %s\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n" "$1"
  printf "ptxas info    : Used %s registers, used 1 barriers, %s bytes smem, 388 bytes cmem[0]\n" "$3" "$4"
}
check() {  # WANT_RC GREP LOG
  local out rc
  out=$(PARSE_ONLY=1 PTXAS_LOG="$3" bash "$here/check_kernel_resources.sh" 80 90 2>&1)
  rc=$?
  if [ "$rc" != "$1" ] || ! grep -q -- "$2" <<<"$out"; then
    echo "FAIL: wanted rc $1 and '$2', got rc $rc:"; echo "$out"; exit 1
  fi
}
{ entry k_a 80 40 1024; entry k_b 80 255 49152; entry k_a 90 40 1024; entry k_b 90 128 0; } >"$tmp/ok.log"
check 0 "sm_80 " "$tmp/ok.log"
{ entry k_a 80 40 1024; entry k_big 80 256 0; entry k_a 90 40 1024; entry k_big 90 64 0; } >"$tmp/regs.log"
check 1 "FAIL k_big on sm_80: 256 registers" "$tmp/regs.log"
{ entry k_a 80 40 1024; entry k_a 90 40 49153; } >"$tmp/smem.log"
check 1 "FAIL k_a on sm_90: 49153 bytes of static shared memory" "$tmp/smem.log"
{ entry k_a 80 40 0; entry k_b 80 40 0; entry k_a 90 40 0; } >"$tmp/missing.log"
check 1 "FAIL: sm_" "$tmp/missing.log"
: >"$tmp/empty.log"
check 1 "ptxas reported no kernels" "$tmp/empty.log"
echo "ok: the checker passes a good log and refuses each violation"
