#!/usr/bin/env bash
# Static GPU readiness (issue 12): every CUDA kernel's resources fit every target architecture, checked
# without a GPU. A kernel that needs more registers or shared memory than an SM offers fails at its first
# launch; this finds it at build time.
#
#   tests/cuda/check_kernel_resources.sh [ARCH...]        (default: 80 86 89 90, the CI targets)
#
#   1. every __global__ kernel in ggml_rp/cuda declares __launch_bounds__(N), and every launch uses the same
#      named constant or a size bounded by it (kElemThreads, kRowMaxThreads via row_threads, kAttnThreads,
#      kSumThreads, 1): with the bound, ptxas keeps registers x N within the SM's register file, so the
#      register side of every launch holds by construction;
#   2. each kernel compiled by ptxas -v for each architecture: at most 255 registers a thread, at most 48 KiB
#      of static shared memory a block (the opt-in dynamic part, attention's tiles, is sized at run time
#      against the device's limit by attention_tiles(), tested in tests/cuda/test_launch.cpp), and the
#      spills are reported;
#   3. each architecture compiled the same kernels (none silently missing).
# Prints a table per architecture; exits 1 on a violation, naming the kernel and the architecture.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(80 86 89 90)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ "${PARSE_ONLY:-0}" = 1 ] || [ -x "$nvcc" ] || { echo "check_kernel_resources: nvcc not found (set NVCC)" >&2; exit 1; }
fail=0

# 1. __launch_bounds__ on every kernel (the declaration may span lines: look at the next two).
while IFS=: read -r file line _; do
  if ! sed -n "${line},$((line + 2))p" "$file" | grep -q "__launch_bounds__"; then
    echo "FAIL $file:$line: a __global__ kernel without __launch_bounds__" >&2
    fail=1
  fi
done < <(grep -n "__global__" "$root"/ggml_rp/cuda/*.cu "$root"/ggml_rp/cuda/*.cuh 2>/dev/null || true)
# Launch sizes: a literal block size other than 1 bypasses the named bounds.
if grep -nE '<<<[^>]*,[[:space:]]*[0-9]{2,}[[:space:]]*,' "$root"/ggml_rp/cuda/*.cu; then
  echo "FAIL: a launch with a literal block size (use the constant of the kernel's __launch_bounds__)" >&2
  fail=1
fi

gencode=()
for a in "${archs[@]}"; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
log=${PTXAS_LOG:-$(mktemp)}
[ -n "${PTXAS_LOG:-}" ] || trap 'rm -f "$log"' EXIT
# PARSE_ONLY=1: check an existing PTXAS_LOG (the checker's own test feeds it bad kernels).
if [ "${PARSE_ONLY:-0}" != 1 ]; then
  # Every file on its own core (nvcc is one thread per file), each into its own log, then the logs in file order.
  parts=$(mktemp -d)
  failed=$(ls "$root"/ggml_rp/cuda/*.cu | xargs -P "$(nproc)" -I{} sh -c \
    '"$0" -c -std=c++20 -O3 -I"$1" -Xptxas -v $2 "{}" -o /dev/null > "$3/$(basename "{}").log" 2>&1 || echo "{}"' \
    "$nvcc" "$root" "${gencode[*]}" "$parts")
  cat "$parts"/*.log > "$log"
  if [ -n "$failed" ]; then
    for cu in $failed; do echo "FAIL: $cu does not compile:" >&2; tail -20 "$parts/$(basename "$cu").log" >&2; done
    rm -rf "$parts"
    exit 1
  fi
  rm -rf "$parts"
fi

# 2-3. One record per (kernel, arch): registers, static smem, spill bytes.
awk -v maxreg=255 -v maxsmem=49152 '
  /Compiling entry function/ {
    match($0, /function .([^'"'"']+)/); split(substr($0, RSTART + 10), parts, "'"'"'"); fn = parts[1]
    match($0, /for .sm_[0-9]+/); arch = substr($0, RSTART + 8, RLENGTH - 8)
  }
  /bytes spill stores/ { spill[fn, arch] = $5 + 0 }
  /Used [0-9]+ registers/ {
    r = 0; s = 0
    for (i = 1; i <= NF; ++i) { if ($(i+1) == "registers,") r = $i + 0; if ($(i+1) == "bytes" && $(i+2) == "smem,") s = $i + 0 }
    if (!(arch in n)) narch++
    n[arch]++
    if (r > maxr[arch]) { maxr[arch] = r; maxrf[arch] = fn }
    if (s > maxs[arch]) { maxs[arch] = s; maxsf[arch] = fn }
    sp[arch] += spill[fn, arch] > 0
    if (r > maxreg) { printf "FAIL %s on sm_%s: %d registers a thread (at most %d)\n", fn, arch, r, maxreg; bad = 1 }
    if (s > maxsmem) { printf "FAIL %s on sm_%s: %d bytes of static shared memory (at most %d)\n", fn, arch, s, maxsmem; bad = 1 }
    if (spill[fn, arch] > 0) printf "note %s on sm_%s: %d bytes of register spills\n", fn, arch, spill[fn, arch]
  }
  END {
    printf "%-6s %8s %9s %10s  %s\n", "arch", "kernels", "max regs", "max smem", "(kernel with the most registers / static smem)"
    first = ""
    for (a in n) {
      printf "sm_%-3s %8d %9d %10d  %s / %s\n", a, n[a], maxr[a], maxs[a], maxrf[a], maxsf[a]
      if (first == "") first = a
      else if (n[a] != n[first]) { printf "FAIL: sm_%s compiled %d kernels, sm_%s %d\n", a, n[a], first, n[first]; bad = 1 }
    }
    if (narch == 0) { print "FAIL: ptxas reported no kernels"; bad = 1 }
    exit bad
  }' "$log" >"$log.table" || fail=1
# Kernel names demangled where binutils is there.
if command -v c++filt >/dev/null; then c++filt <"$log.table"; else cat "$log.table"; fi
rm -f "$log.table"
exit $fail
