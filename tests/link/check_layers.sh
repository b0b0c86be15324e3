#!/usr/bin/env bash
# The layers include only the layers below them. Fails naming the file and the include that points up or
# sideways, and a source file outside every layer.
#   ggml_rp/ (ggml_rp/CMakeLists.txt: one library per folder):
#     core <- ops <- cpu <- runtime <- roundpipe, dist;  core <- optim;  core, ops, runtime <- cuda (the
#     plugin); roundpipe reads cuda/backend_plan.h, the CUDA backend's host-side rules (header-only)
#   models/ (models/CMakeLists.txt: one library per room):
#     text <- arch <- data <- train <- check, arch <- convert <- check
#   gguf/ and base/ include neither; ggml_rp/ never includes models/.
# Usage: check_layers.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
# What a file of each layer may include: folders of its tree, or single files (folder/file.h).
declare -A allowed=(
  [ggml_rp/core]="core"
  [ggml_rp/ops]="core ops"
  [ggml_rp/cpu]="core ops cpu"
  [ggml_rp/runtime]="core ops cpu runtime"
  [ggml_rp/roundpipe]="core ops cpu runtime roundpipe cuda/backend_plan.h cuda/launch.h"
  [ggml_rp/optim]="core optim"
  [ggml_rp/dist]="core ops cpu runtime dist"
  [ggml_rp/cuda]="core ops runtime cuda"
  [ggml_rp/.]="core ops cpu"
  [models/text]="text"
  [models/arch]="text arch"
  [models/data]="text data"
  [models/convert]="text arch convert"
  [models/train]="text arch data train"
  [models/check]="text arch data convert train check"
)
fail=0
check_tree() {  # tree: ggml_rp or models
  local tree=$1 f rel layer inc to ok entry
  while IFS= read -r f; do
    rel=${f#"$root"/"$tree"/}
    layer=${rel%%/*}
    [ "$layer" = "$rel" ] && layer=.
    if [ -z "${allowed[$tree/$layer]+x}" ] || { [ "$tree" = models ] && [ "$layer" = . ]; }; then
      echo "FAIL $tree/$rel: outside the layers of $tree/" >&2
      fail=1
      continue
    fi
    while IFS= read -r inc; do
      to=${inc#"$tree"/}
      ok=0
      for entry in ${allowed[$tree/$layer]}; do
        case $entry in
          */*) [ "$to" = "$entry" ] && ok=1 ;;
          *) [ "${to%%/*}" = "$entry" ] && ok=1 ;;
        esac
      done
      [ $ok = 1 ] || { echo "FAIL $tree/$rel ($layer) includes $inc: $layer may include only ${allowed[$tree/$layer]}" >&2; fail=1; }
    done < <(sed -n 's/^#include "\('"$tree"'\/[^"]*\)".*/\1/p' "$f")
  done < <(find "$root/$tree" \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
}
check_tree ggml_rp
check_tree models
if grep -rln '#include "models/' "$root/ggml_rp" "$root/gguf" "$root/base" 2>/dev/null; then
  echo "FAIL: the files above (ggml_rp, gguf, base) include models/" >&2
  fail=1
fi
if grep -rln '#include "ggml_rp/' "$root/gguf" "$root/base" 2>/dev/null; then
  echo "FAIL: the files above (gguf, base) include ggml_rp/" >&2
  fail=1
fi
[ $fail = 0 ] && echo "ok: every ggml_rp/ and models/ include points to its layer or one below"
exit $fail
