# Sourced by the RoundPipe benchmarks: the generated 20-layer llama they run on (15M parameters, the stories260K
# vocabulary) written to $out/llama20.gguf by the rp-gguf of $build.
synth_llama20() {
  local shared=${RP_SHARED_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/../shared}
  "$build/bin/rp-gguf" synth "$out/llama20.gguf" --vocab "$shared/models/stories260K.gguf" --n-embd 256 --n-head 4 \
    --n-head-kv 2 --n-ff 704 --n-layer 20 --n-ctx 2048 --seed 42
}
