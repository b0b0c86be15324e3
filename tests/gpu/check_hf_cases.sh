#!/usr/bin/env bash
# The half of the GPU check's transformers cross-check of our exports that needs no GPU (bench/gpu/hf_cases.sh), run
# here: every case is made (a model of each exported architecture, its Hugging Face export, a PEFT adapter, our
# logits dump, texts with our ids), the configs and adapter configs are JSON with the fields transformers and PEFT
# read, and Hugging Face's tokenizers.js reads each case's tokenizer files and gives our ids for its texts.
#   check_hf_cases.sh SOURCE_DIR BIN_DIR SHARED_DIR NODE TOKENIZERS_MJS
set -euo pipefail
src=${1:?usage}; bin=${2:?usage}; shared=${3:?usage}; node=${4:-}; lib=${5:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ -z "$node" ] || [ ! -x "$node" ] || [ ! -f "$lib" ]; then
  [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ] && fail "Node.js or tokenizers.js missing in CI (scripts/fetch-oracle.sh, then reconfigure)"
  echo "skipped: Node.js or tokenizers.js missing (scripts/fetch-oracle.sh, then reconfigure)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash "$src/bench/gpu/hf_cases.sh" "$bin" "$shared/models" "$tmp" || fail "hf_cases.sh did not make every case"
for c in llama qwen3moe phi3 gemma3 gpt-oss qwen35 qwen35moe mistral3; do
  d="$tmp/$c"
  for f in model.gguf a1.gguf step.gguf hf/config.json hf/model.safetensors.index.json hf/tokenizer.json \
           hf/tokenizer_config.json peft/adapter_config.json peft/adapter_model.safetensors texts/0.ids; do
    [ -s "$d/$f" ] || fail "$c: no $f"
  done
  python3 - "$d" <<'PY' || fail "$c: the configs"
import json, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/hf/config.json"))
assert cfg["architectures"] and cfg["model_type"], cfg
ad = json.load(open(f"{d}/peft/adapter_config.json"))
assert ad["peft_type"] == "LORA" and ad["target_modules"] and ad["r"] == 4, ad
texts = [open(f"{d}/texts/{i}.txt", encoding="utf-8").read() for i in range(5)]
json.dump(texts, open(f"{d}/texts.json", "w"))
PY
  "$node" "$src/tests/tokenizer/hf/hf_tokenize.mjs" "$lib" "$d/hf" "$d/texts.json" > "$d/peer.json" || fail "$c: tokenizers.js"
  python3 - "$d" "$c" <<'PY' || fail "$c: tokenizers.js's ids differ from ours"
import json, sys
d, c = sys.argv[1], sys.argv[2]
peer = json.load(open(f"{d}/peer.json"))
for i, p in enumerate(peer):
    ours = [int(x) for x in open(f"{d}/texts/{i}.ids").read().split()]
    if p["plain"] != ours:
        sys.exit(f"{c} text {i}: tokenizers.js {p['plain']} ours {ours}")
print(f"ok: {c}: {len(peer)} texts")
PY
done
echo "ok: every case"
