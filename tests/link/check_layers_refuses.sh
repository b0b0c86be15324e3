#!/usr/bin/env bash
# check_model_rooms.sh must refuse an upward include, a sideways one and a file outside the rooms.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/models/text" "$tmp/models/convert" "$tmp/models/train" "$tmp/ggml_rp" "$tmp/gguf" "$tmp/base"
expect_refused() {  # what: the case; then the tree is reset
  if out=$(bash "$here/check_model_rooms.sh" "$tmp" 2>&1); then echo "FAIL: accepted $1"; exit 1; fi
  echo "$out" | grep -q "$2" || { echo "FAIL: $1: the message does not name $2: $out"; exit 1; }
  rm -f "$tmp"/models/*/*.h "$tmp"/models/*.h
}
echo '#include "models/train/session.h"' > "$tmp/models/text/tokenizer.h"
expect_refused "text including train" "models/text/tokenizer.h (text) includes models/train/session.h"
echo '#include "models/data/dataset.h"' > "$tmp/models/convert/quant_mix.h"
expect_refused "convert including data" "models/convert/quant_mix.h (convert) includes models/data/dataset.h"
echo '' > "$tmp/models/loose.h"
expect_refused "a file outside the rooms" "models/loose.h: outside the rooms"
echo '#include "models/text/unicode.h"' > "$tmp/models/train/ok.h"
bash "$here/check_model_rooms.sh" "$tmp" >/dev/null || { echo "FAIL: refused a downward include"; exit 1; }
echo "ok: upward, sideways and roomless files are refused; downward includes pass"
