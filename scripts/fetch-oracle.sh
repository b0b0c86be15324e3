#!/usr/bin/env bash
# Fetches the llama.cpp reference oracle's prebuilt CPU libraries and headers (docs: docs/reference-oracle.md
# §1-§2), and Hugging Face's JavaScript tokenizers (the peer of our exported tokenizer.json). Usage: scripts/fetch-oracle.sh [DEST]   (default DEST = .oracle in the repository root).
# Idempotent: tarballs already in DEST/npm are not downloaded again, DEST/bins and DEST/llama.cpp are made only
# when missing (an older DEST/llama.cpp without common/ or models/templates/ gets them). Nothing is built: the
# bundle is cloned only for llama.h, ggml's headers, common/ (rp-chat-oracle) and llama.cpp's chat templates.
set -euo pipefail

BIN_PKG="@node-llama-cpp/linux-x64@3.21.1"
SRC_PKG="node-llama-cpp@3.21.1"
BIN_TGZ="node-llama-cpp-linux-x64-3.21.1.tgz"
SRC_TGZ="node-llama-cpp-3.21.1.tgz"
LLAMA_COMMIT="80fb11ac73e66d89eae2c6a91d8a77428fa733ed"
# sha256 of the tarballs (they match the registry's sha512 integrity); checked after download and before unpacking.
BIN_SHA="4b5b65a8b2611d8af94349b02d815c0f424a30a0a19aef2be5db25ecfef6730f"
SRC_SHA="7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f"
# tokenizers.js (pure JavaScript, no dependencies): reads the tokenizer.json that rp-gguf export-hf writes.
HFTOK_PKG="@huggingface/tokenizers@0.2.0"
HFTOK_TGZ="huggingface-tokenizers-0.2.0.tgz"
HFTOK_SHA="2800014c83b8186b2e4210c20672f1fb65a12cef85d7e95e0f2003e022611b4a"

die() { echo "fetch-oracle: error: $*" >&2; exit 1; }
say() { echo "fetch-oracle: $*"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$root/.oracle}"
mkdir -p "$DEST/npm"
DEST="$(cd "$DEST" && pwd)"
tmp=""  # the scratch folder of the current step; removed on any exit, so a failed run leaves nothing half-made
trap 'if [ -n "$tmp" ]; then rm -rf "$tmp"; fi' EXIT

check() { # check FILE SHA
  echo "$2  $1" | sha256sum -c --quiet - >/dev/null 2>&1 \
    || die "$1 has the wrong sha256 (corrupt or not the pinned version); delete it and rerun"
}

# ---- 1. the two tarballs -------------------------------------------------------------------------------------
pack() { # pack PKG TGZ SHA
  if [ -s "$DEST/npm/$2" ]; then
    say "have $DEST/npm/$2"
    return
  fi
  command -v npm >/dev/null 2>&1 || die "npm is not installed (needed to download $1); install Node.js/npm"
  say "npm pack $1"
  tmp="$(mktemp -d "$DEST/npm/.pack.XXXXXX")"
  if ! (cd "$tmp" && npm pack --loglevel=error "$1" >/dev/null 2>"$tmp/npm.log"); then
    cat "$tmp/npm.log" >&2
    die "npm pack $1 failed (is the npm registry reachable?)"
  fi
  [ -s "$tmp/$2" ] || die "npm pack $1 did not write $2"
  check "$tmp/$2" "$3"
  mv "$tmp/$2" "$DEST/npm/$2"
  rm -rf "$tmp"; tmp=""
  say "wrote $DEST/npm/$2 ($(stat -c %s "$DEST/npm/$2") bytes)"
}
pack "$BIN_PKG" "$BIN_TGZ" "$BIN_SHA"
pack "$SRC_PKG" "$SRC_TGZ" "$SRC_SHA"
pack "$HFTOK_PKG" "$HFTOK_TGZ" "$HFTOK_SHA"

# ---- 2. the binaries: package/bins/linux-x64/* -> DEST/bins ----------------------------------------------------
if [ -f "$DEST/bins/libllama.v0.4.0.so" ]; then
  say "have $DEST/bins"
else
  check "$DEST/npm/$BIN_TGZ" "$BIN_SHA"
  tmp="$(mktemp -d "$DEST/.bins.XXXXXX")"
  tar -xzf "$DEST/npm/$BIN_TGZ" -C "$tmp" package/bins/linux-x64 || die "cannot unpack $BIN_TGZ"
  [ -f "$tmp/package/bins/linux-x64/libllama.v0.4.0.so" ] || die "$BIN_TGZ lacks libllama.v0.4.0.so"
  rm -rf "$DEST/bins"
  mv "$tmp/package/bins/linux-x64" "$DEST/bins"
  rm -rf "$tmp"; tmp=""
  say "unpacked $(find "$DEST/bins" -type f | wc -l) files to $DEST/bins"
fi

# ---- 3. the headers: clone the source bundle (checkout of include/ and ggml/include/ only) -----------------------
if [ -f "$DEST/llama.cpp/include/llama.h" ] && [ -f "$DEST/llama.cpp/ggml/include/ggml-backend.h" ]; then
  say "have $DEST/llama.cpp"
else
  command -v git >/dev/null 2>&1 || die "git is not installed (needed to read the llama.cpp source bundle)"
  check "$DEST/npm/$SRC_TGZ" "$SRC_SHA"
  tmp="$(mktemp -d "$DEST/.src.XXXXXX")"
  tar -xzf "$DEST/npm/$SRC_TGZ" -C "$tmp" package/llama/gitRelease.bundle || die "cannot unpack $SRC_TGZ"
  git clone -q --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp" || die "git clone of gitRelease.bundle failed"
  (cd "$tmp/llama.cpp" && git checkout -q "$LLAMA_COMMIT" -- include ggml/include) \
    || die "the llama.cpp bundle lacks commit $LLAMA_COMMIT"
  rm -rf "$DEST/llama.cpp"
  mv "$tmp/llama.cpp" "$DEST/llama.cpp"
  rm -rf "$tmp"; tmp=""
  say "cloned llama.cpp $LLAMA_COMMIT headers to $DEST/llama.cpp"
fi

# ---- 4. the chat-template oracle's headers (common/) and llama.cpp's template collection (models/templates/) ----
# A separate step so that an existing DEST/llama.cpp made by an earlier version of this script gets them too.
if [ -f "$DEST/llama.cpp/common/chat.h" ] && [ -d "$DEST/llama.cpp/models/templates" ]; then
  say "have $DEST/llama.cpp/common and models/templates"
else
  command -v git >/dev/null 2>&1 || die "git is not installed (needed to read the llama.cpp source bundle)"
  check "$DEST/npm/$SRC_TGZ" "$SRC_SHA"
  tmp="$(mktemp -d "$DEST/.common.XXXXXX")"
  tar -xzf "$DEST/npm/$SRC_TGZ" -C "$tmp" package/llama/gitRelease.bundle || die "cannot unpack $SRC_TGZ"
  git clone -q --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp" || die "git clone of gitRelease.bundle failed"
  (cd "$tmp/llama.cpp" && git checkout -q "$LLAMA_COMMIT" -- common models/templates) \
    || die "the llama.cpp bundle lacks common/ or models/templates at $LLAMA_COMMIT"
  rm -rf "$DEST/llama.cpp/common" "$DEST/llama.cpp/models"
  mkdir -p "$DEST/llama.cpp"
  mv "$tmp/llama.cpp/common" "$DEST/llama.cpp/common"
  mkdir -p "$DEST/llama.cpp/models"
  mv "$tmp/llama.cpp/models/templates" "$DEST/llama.cpp/models/templates"
  rm -rf "$tmp"; tmp=""
  say "checked out llama.cpp $LLAMA_COMMIT common/ and models/templates/ to $DEST/llama.cpp"
fi

# ---- 5. tokenizers.js: package/ -> DEST/hf-tokenizers ------------------------------------------------------------
if [ -f "$DEST/hf-tokenizers/dist/tokenizers.mjs" ]; then
  say "have $DEST/hf-tokenizers"
else
  check "$DEST/npm/$HFTOK_TGZ" "$HFTOK_SHA"
  tmp="$(mktemp -d "$DEST/.hftok.XXXXXX")"
  tar -xzf "$DEST/npm/$HFTOK_TGZ" -C "$tmp" package || die "cannot unpack $HFTOK_TGZ"
  [ -f "$tmp/package/dist/tokenizers.mjs" ] || die "$HFTOK_TGZ lacks dist/tokenizers.mjs"
  rm -rf "$DEST/hf-tokenizers"
  mv "$tmp/package" "$DEST/hf-tokenizers"
  rm -rf "$tmp"; tmp=""
  say "unpacked $HFTOK_PKG to $DEST/hf-tokenizers"
fi

say "ready: bins=$DEST/bins headers=$DEST/llama.cpp/include $DEST/llama.cpp/ggml/include"
