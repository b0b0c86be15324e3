#!/usr/bin/env bash
# Data-parallel scaling (architecture.md 8), side by side in one run:
#  1. the real runtime under mpirun (rp-bench dp): R = 1, 2, 4 ranks on this machine, each RoundPipe on 2 CPU
#     virtual devices with emulated compute (the layers' measured times), gradients all-reduced over MPI for real
#     on an emulated inter-node link of 25 Gbit/s and 100 Gbit/s; a generated 20-layer llama (15M parameters),
#     LoRA r=8 and full;
#  2. the timing model (rp-simulate --nodes R) at the scale of 8 RTX 4090s per server: Llama-3.1-8B and
#     Qwen3-32B shapes, LoRA r=32 and full, 25 and 100 Gbit/s.
# Efficiency = step time at R = 1 / step time at R (weak scaling: every rank trains its own micro-batches).
#   bench/mpi/scaling.sh BUILD_DIR [OUT_DIR]        about 2 minutes
set -euo pipefail
build=${1:?usage: scaling.sh BUILD_DIR [OUT_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
"$build/bin/rp-gguf" synth "$out/llama20.gguf" --vocab "$shared/models/stories260K.gguf" --n-embd 256 --n-head 4 \
  --n-head-kv 2 --n-ff 704 --n-layer 20 --n-ctx 2048 --seed 42 >/dev/null

echo "== the runtime under mpirun (emulated compute, 2 devices per rank, 4 micro-batches per rank and step)"
printf "%-6s %-16s %4s %12s %14s %16s %11s\n" mode link R "step ms" "tokens/s/rank" "exposed ms/step" efficiency
for mode in lora full; do
  flag=""; [ "$mode" = full ] && flag="--full"
  base=$("${mpi[@]}" -np 1 "$build/bin/rp-bench" dp --model "$out/llama20.gguf" $flag --steps 4 | grep '^dp ')
  t1=$(sed -E 's/.*step=([0-9.]+)ms.*/\1/' <<<"$base")
  printf "%-6s %-16s %4d %12.2f %14s %16s %10.1f%%\n" $mode - 1 "$t1" "$(sed -E 's/.*tokens\/s\/rank=([0-9]+).*/\1/' <<<"$base")" 0 100
  for link in 25Gbit/s,10us 100Gbit/s,5us; do
    for R in 2 4; do
      line=$("${mpi[@]}" -np $R "$build/bin/rp-bench" dp --model "$out/llama20.gguf" $flag --steps 4 --link $link | grep '^dp ')
      t=$(sed -E 's/.*step=([0-9.]+)ms.*/\1/' <<<"$line")
      printf "%-6s %-16s %4d %12.2f %14s %16s %10.1f%%\n" $mode $link $R "$t" "$(sed -E 's/.*tokens\/s\/rank=([0-9]+).*/\1/' <<<"$line")" \
        "$(sed -E 's/.*exposed_allreduce=([0-9.]+)ms.*/\1/' <<<"$line")" "$(echo "100 * $t1 / $t" | bc -l)"
    done
  done
done | tee "$out/runtime.txt"

echo
echo "== the timing model: 8 x RTX 4090 per server, 16 micro-batches of 8192 tokens (roundpipe.md 13.8 times)"
for model in llama3.1-8b qwen3-32b; do
  for mode in "" --full; do
    for link in 25Gbit/s,10us 100Gbit/s,5us; do
      for R in 2 4; do
        "$build/bin/rp-simulate" --model $model --nodes $R --node-link $link $mode | grep 'nodes over' | sed "s/^ */$model: /"
      done
    done
  done
done | tee "$out/model.txt"
echo "results in $out"
