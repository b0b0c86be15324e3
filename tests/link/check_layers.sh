#!/usr/bin/env bash
# models/ is in rooms (models/CMakeLists.txt), each including only the rooms below it:
#   text <- arch <- data <- train <- check, arch <- convert <- check
# Fails naming the file and the include that points up or sideways, and for a source file outside a room.
# Usage: check_model_rooms.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
declare -A allowed=(
  [text]="text"
  [arch]="text arch"
  [data]="text data"
  [convert]="text arch convert"
  [train]="text arch data train"
  [check]="text arch data convert train check"
)
fail=0
while IFS= read -r f; do
  rel=${f#"$root"/models/}
  room=${rel%%/*}
  if [ "$room" = "$rel" ] || [ -z "${allowed[$room]+x}" ]; then
    echo "FAIL models/$rel: outside the rooms (text, arch, data, convert, train, check)" >&2
    fail=1
    continue
  fi
  while IFS= read -r inc; do
    to=${inc#models/}
    to=${to%%/*}
    case " ${allowed[$room]} " in
      *" $to "*) ;;
      *) echo "FAIL models/$rel ($room) includes $inc: $room may include only ${allowed[$room]}" >&2; fail=1 ;;
    esac
  done < <(sed -n 's/^#include "\(models\/[^"]*\)".*/\1/p' "$f")
done < <(find "$root/models" -name '*.cpp' -o -name '*.h' | sort)
# The engine and the file format never include models/.
if grep -rln '#include "models/' "$root/ggml_rp" "$root/gguf" "$root/base" 2>/dev/null; then
  echo "FAIL: the files above (ggml_rp, gguf, base) include models/" >&2
  fail=1
fi
[ $fail = 0 ] && echo "ok: every models/ include points to its room or one below"
exit $fail
