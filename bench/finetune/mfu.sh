#!/usr/bin/env bash
# Training MFU on the Qwen3-0.6B shape (issue 42's training goal: >= 60% of the FMA peak): rp-finetune's model
# FLOP/s (its "model FLOPs" line: ggml_rp/ops/flops.h, the forward and the backward once, weight gradients for
# full finetuning, a recompute not counted) over the FMA peak `rp-bench ops --only peak` measures on the same
# threads, in the same run. LoRA (rank 8, default targets) and full finetuning of a bf16 file with Qwen3-0.6B's
# shape and vocabulary (rp-gguf synth), BATCH sequences of SEQ tokens a step, with the default activation
# memory (the layers past 2 GiB recomputed in the backward) and with every layer kept (--activation-memory 64G).
#
#   bench/finetune/mfu.sh BUILD_DIR [THREADS]      env: SEQ (256), BATCH (8), STEPS (3)
#
# Needs about 14 GiB of RAM (full finetuning: fp32 masters, gradients and AdamW state of 0.6B parameters).
# Each row is one run: the host is shared, compare rows of the same run. "steps 2+" leaves out the first step, which
# first-touches every buffer (page faults: 5-10 s more than a later step at this shape) and is not what a long run
# runs at. The runs take the tools' OpenMP default (GOMP_SPINCOUNT=10000, tools/omp_defaults.cpp), as a user's do;
# OMP_WAIT_POLICY=PASSIVE, which the tests use, cost 10-15% here.
#
# Measured 2026-12-07 (night) on a 2-core Intel Xeon (Ice Lake: AVX-512, no BF16), 2 threads, main at 97beb95, 4 steps;
# FMA peak 351.6 GFLOP/s, the GEMM micro-kernel on L1-resident panels 346.2 GFLOP/s:
#   mode  activations            tok/s  GFLOP/s  MFU     steps 2+: tok/s  GFLOP/s  MFU     peak RSS
#   LoRA  default (2 GiB kept)      75    187.6  53.4%             77.3     193.5  55.0%   3798 MiB
#   LoRA  all kept                  84    210.3  59.8%             89.3     223.5  63.6%   6355 MiB
#   full  default (2 GiB kept)      44    184.3  52.4%             54.0     197.9  56.3%  12268 MiB
#   full  all kept                  52    213.3  60.7%             61.0     223.5  63.6%  14841 MiB
#
# Measured 2026-12-07 (later) on the same kind of Xeon, 2 threads, main with the even GEMM column split and the
# optimizer's one pass; FMA peak 437.6 GFLOP/s, the GEMM micro-kernel on L1-resident panels 386.9 GFLOP/s (88%):
#   mode  activations            tok/s  GFLOP/s  MFU     of the kernel  peak RSS
#   LoRA  default (2 GiB kept)      77    193.8  44.3%   50.1%          3798 MiB
#   LoRA  all kept                  85    213.3  48.7%   55.1%          6356 MiB
#   full  default (2 GiB kept)      45    201.8  46.1%   52.2%         12272 MiB
#   full  all kept                  52    218.3  49.9%   56.4%         14836 MiB
#
# LoRA rows measured 2026-12-07 on a 2-core Intel Xeon (Sapphire Rapids, AVX-512), 2 threads, before (006de9c) and
# after LoRA branches were added into W x by their GEMM and activation gradients summed by the products (mul_mat's and
# mul_mat_back_x's into), alternated in one run; the peak read 478 GFLOP/s in this run (399 an hour earlier: the
# VM's peak moves with its neighbours, so MFU is given against this run's reading):
#   mode  activations            before: tok/s  GFLOP/s  MFU     after: tok/s  GFLOP/s  MFU     peak RSS
#   LoRA  default (2 GiB kept)           83     208.2    43.5%          88     219.8    46.0%   3798 MiB
#   LoRA  all kept                       93     234.3    49.0%          97     244.8    51.2%   6355 MiB
set -euo pipefail
build=${1:?usage: mfu.sh BUILD_DIR [THREADS]}
threads=${2:-$(nproc)}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
seq=${SEQ:-256} batch=${BATCH:-8} steps=${STEPS:-3}
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 2 ]] || { echo "mfu.sh: STEPS=$steps: needs 2 or more (the steady state is steps 2+)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bin/rp-gguf" synth "$tmp/q06.gguf" --shape qwen3-0.6b --vocab "$shared/models/vocab/ggml-vocab-qwen2.gguf" --type bf16 > /dev/null
for _ in $(seq 1 $((seq * batch * steps / 8))); do cat "$root/examples/data/stories.txt"; done > "$tmp/data.txt"
peaks=$(OMP_NUM_THREADS=$threads "$build/bin/rp-bench" ops --only peak -t "$threads")
# The FMA loop's and the GEMM micro-kernel's GFLOP/s on all the threads (on 1 thread: the "1 thread" figure)
peak=$(sed -n 's/^FMA peak.* \([0-9.]*\) GFLOP\/s on [0-9]* threads.*/\1/p' <<< "$peaks")
[[ -n "$peak" ]] || peak=$(sed -n 's/^FMA peak[^:]*: \([0-9.]*\) GFLOP\/s on 1 thread.*/\1/p' <<< "$peaks")
kernel=$(sed -n 's/^GEMM micro-kernel.* \([0-9.]*\) GFLOP\/s on [0-9]* threads.*/\1/p' <<< "$peaks")
[[ -n "$kernel" ]] || kernel=$(sed -n 's/^GEMM micro-kernel[^:]*: \([0-9.]*\) GFLOP\/s on 1 thread.*/\1/p' <<< "$peaks")
[[ -n "$peak" && -n "$kernel" ]] || { echo "rp-bench ops --only peak gave no peak:" >&2; echo "$peaks" >&2; exit 1; }
echo "== Qwen3-0.6B shape, bf16, $batch x $seq tokens a step, $steps steps, $threads threads" \
     "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')); FMA peak $peak GFLOP/s," \
     "GEMM micro-kernel on L1-resident panels $kernel GFLOP/s"
printf '| mode | activations | tok/s | GFLOP/token | model GFLOP/s | MFU | of the kernel | steps 2+: tok/s | GFLOP/s | MFU | peak RSS |\n'
printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
run() {  # MODE_ARGS LABEL ACT_ARGS ACT_LABEL
  local out
  out=$("$build/bin/rp-finetune" -m "$tmp/q06.gguf" --data "$tmp/data.txt" -o "$tmp/out.gguf" \
        --seq-len "$seq" --batch "$batch" --steps "$steps" -t "$threads" $1 $3 2>&1)
  local toks rss gpt gfs steady
  toks=$(sed -n 's/^done: .* s, \([0-9]*\) tok\/s.*/\1/p' <<< "$out")
  # the steps after the first, as one rate (tokens over time: the harmonic mean of their equal-token steps' rates)
  steady=$(sed -n 's/^step \([0-9]*\)\/[0-9]* |.*| \([0-9.]*\) tok\/s |.*/\1 \2/p' <<< "$out" |
           awk '$1 > 1 { n++; inv += 1 / $2 } END { if (n) printf "%.1f", n / inv }')
  rss=$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' <<< "$out")
  gpt=$(sed -n 's/^model FLOPs: \([0-9.]*\) GFLOP per token.*/\1/p' <<< "$out")
  gfs=$(sed -n 's/^model FLOPs: .*, \([0-9.]*\) GFLOP\/s over the steps.*/\1/p' <<< "$out")
  [[ -n "$gfs" && -n "$steady" ]] || { echo "rp-finetune $1 $3 failed:" >&2; tail -5 <<< "$out" >&2; exit 1; }
  awk -v m="$2" -v a="$4" -v t="$toks" -v g="$gpt" -v f="$gfs" -v p="$peak" -v k="$kernel" -v r="$rss" -v s="$steady" \
    'BEGIN { printf "| %s | %s | %d | %.3f | %.1f | %.1f%% | %.1f%% | %.1f | %.1f | %.1f%% | %.0f MiB |\n", m, a, t, g, f, 100 * f / p, 100 * f / k,
             s, s * g, 100 * s * g / p, r }'
}
run "--lora-rank 8" LoRA "" "default (2 GiB kept)"
run "--lora-rank 8" LoRA "--activation-memory 64G" "all kept"
run "--full" full "" "default (2 GiB kept)"
run "--full" full "--activation-memory 64G" "all kept"
