#!/usr/bin/env bash
# The command-line tools do not link the CUDA libraries (the CUDA backend is a plugin they dlopen only for
# --backend cuda, runtime/device_plugin.h), so one build runs on a machine without CUDA and a CPU run does not
# pay for cuBLAS. Checks, for the tools in BIN_DIR:
#   - ldd of every rp-* program (but rp-cuda-bench, which calls the kernels directly) names no libcuda*,
#     libcudart*, libcublas*;
#   - rp-finetune --help peaks below 64 MiB of resident memory;
#   - with the plugin next to the tools (a CUDA build): the plugin links libcudart and libcublas, exports
#     nothing but its entry point (hidden visibility, a version script), and
#     --backend cuda either trains or (no GPU here) fails with a message naming CUDA, leaving no file;
#     without it: --backend cuda says the build has no CUDA backend.
#   check_tools.sh BIN_DIR SHARED_DIR
set -euo pipefail
bin=${1:?usage: check_tools.sh BIN_DIR SHARED_DIR}
shared=${2:?usage: check_tools.sh BIN_DIR SHARED_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }
n=0
for t in "$bin"/rp-*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$(basename "$t")" in rp-cuda-bench) continue ;; esac
  if ldd "$t" | grep -E 'libcuda|libcudart|libcublas'; then fail "$(basename "$t") links CUDA libraries"; fi
  n=$((n + 1))
done
[ "$n" -ge 8 ] || fail "only $n tools found in $bin"
echo "ok: $n tools link no CUDA library"

if command -v /usr/bin/time >/dev/null 2>&1; then
  rss=$( { /usr/bin/time -f '%M' "$bin/rp-finetune" --help >/dev/null; } 2>&1 | tail -1)
  [ "$rss" -lt 65536 ] || fail "rp-finetune --help peaks at $rss KiB"
  echo "ok: rp-finetune --help peaks at $rss KiB"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
set +e
"$bin/rp-finetune" -m "$shared/models/stories260K.gguf" --data "$shared/models/reference/train.txt" -o "$tmp/a.gguf" \
  --steps 1 --seq-len 16 --batch 2 --devices 1 --backend cuda --device-mem 64M >"$tmp/log" 2>&1
rc=$?
set -e
if [ -e "$bin/libggml_rp_cuda.so" ]; then
  # (ldd's output in a variable: `ldd | grep -q` under pipefail fails when grep exits before ldd has written all)
  plugin_libs=$(ldd "$bin/libggml_rp_cuda.so")
  grep -q libcudart <<<"$plugin_libs" || fail "the plugin does not link libcudart"
  grep -q libcublas <<<"$plugin_libs" || fail "the plugin does not link libcublas"
  exported=$(nm -D --defined-only "$bin/libggml_rp_cuda.so" | awk '$2 ~ /^[TDBVWRiu]$/ {print $3}' | sort -u | tr '\n' ' ')
  [ "$exported" = "rp_device_plugin_v1 " ] || fail "the plugin exports more than its entry point: ${exported:0:400}"
  echo "ok: the plugin exports only rp_device_plugin_v1"
  if [ "$rc" -ne 0 ]; then
    grep -qi "cuda\|gpu" "$tmp/log" || fail "--backend cuda failed without naming CUDA: $(cat "$tmp/log")"
    [ -z "$(ls "$tmp" | grep -v '^log$')" ] || fail "--backend cuda left files: $(ls "$tmp")"
    echo "ok: --backend cuda without a usable GPU: $(grep '^error' "$tmp/log")"
  else
    [ -s "$tmp/a.gguf" ] || fail "--backend cuda exited 0 without writing the adapter"
    echo "ok: --backend cuda trained on $(grep -o 'RoundPipe: .*' "$tmp/log" | head -1)"
  fi
else
  [ "$rc" -eq 1 ] || fail "--backend cuda in a build without CUDA exited $rc"
  grep -q "no CUDA backend" "$tmp/log" || fail "unexpected message: $(cat "$tmp/log")"
  [ -z "$(ls "$tmp" | grep -v '^log$')" ] || fail "--backend cuda left files: $(ls "$tmp")"
  echo "ok: $(grep '^error' "$tmp/log")"
fi
