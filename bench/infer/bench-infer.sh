#!/usr/bin/env bash
# Inference speed, ours against llama.cpp in the same run: prompt processing (one batch) and greedy
# generation (one token per step), in tokens/s, on stories260K and on a random-weight ~98M-parameter llama
# written by rp-gguf synth (--shape llama-98m). llama.cpp is the prebuilt CPU library behind rp-oracle
# (tests/oracle/program/oracle.cpp; F32 KV cache, no flash attention, like our engine).
#
#   bench/infer/bench-infer.sh [BUILD_DIR]      (default: build; needs bin/rp-generate and bin/rp-oracle)
#   env: THREADS (2), TG (generated tokens, 64), REPS (best of, 3), WORK (scratch dir, a fresh temp dir),
#        QWEN (1: also the Qwen3-0.6B-shaped bf16 model and its QUANTS; 0: only the two small ones)
#        GPTOSS (1: also a small gpt-oss-shaped mixture, its experts MXFP4 and the rest Q8_0 as llama-quantize's
#        mxfp4_moe writes them: 12 layers of n_embd 1024, 16 experts of 1024 (4 used), the Qwen vocabulary)
#        QUANTS (rp-gguf convert types of the 0.6B model, default "q8_0 q4_k_m q3_k_m q2_k"),
#        BEFORE (another build's folder, e.g. main before a change: its rp-generate is measured too, in the same
#        run on the same models, in a "before" column)
#
# How each figure is measured:
#   ours  prompt    rp-generate -f train.txt -n 1: its "prompt: X tokens/s" (one eval of the whole prompt)
#   ours  generate  rp-generate -p "Once upon a time" -n TG --temp 0: its "X tokens/s" (stops early at EOS)
#   llama prompt    rp-oracle logits --prompt-file train.txt: its "decode(N tok) T ms" (logits of every position)
#   llama generate  wall time of rp-oracle generate -n TG --ignore-eos minus that of -n 0, divided by TG
# Each figure is the best of REPS runs. The ratio is ours / llama.cpp (above 1: we are faster).
# Generation is bound by memory bandwidth: every generated token reads every weight once (token_embd only one
# row, unless it is the tied head). Each generate row also gives those weight bytes per token, the GB/s both
# engines stream them at, and a memcpy and a read-only stream (rp-bench gguf's "read": every byte loaded once,
# nothing stored, the best of the hardware prefetchers alone and software prefetches into L2; the tables below were
# measured against the first only, a limit about 15% lower on their Xeon) of the same size on THREADS threads
# measured in the same run (the best of REPS), so "at the limit" is a ratio. memcpy moves each byte twice (read and
# write), so a read stream beats it; the read stream is the real limit of generation. (A model that fits the last-level cache, like llama-98M in a 480 MiB L3, can
# beat both.)
#
# Prompts in int8 (ggml_rp/cpu/gemm_int8.h), measured 2026-12-07 on a 2-core Intel Xeon (AVX-512 VNNI, BF16 and AMX;
# 480 MiB L3, so these models' "read stream" is partly the cache's), THREADS=2, REPS=3, TG=64, GPTOSS=1,
# QUANTS="q8_0 q6_k q5_k_m q4_k_m q3_k_m q2_k q4_0", BEFORE= main before it (e96857b), in the same run:
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   before  GB/s ours / llama.cpp / memcpy / read stream
#   stories260K        prompt (840 tokens)            55392.5         4280.7    12.94   54015.4
#   stories260K        generate (64 tokens)           10590.3         4291.8     2.47   10742.0  (1.0 MB: cache-resident)
#   llama-98M          prompt (840 tokens)             1210.2          346.2     3.50    1247.5
#   llama-98M          generate (64 tokens)              65.6           65.0     1.01      65.0  25.59 / 25.36 / 13.22 / 34.28 (75%)
#   qwen3-0.6B-bf16    prompt (468 tokens)              287.7           91.1     3.16     293.4
#   qwen3-0.6B-bf16    generate (64 tokens)              18.3           15.6     1.17      17.8  21.82 / 18.60 / 13.45 / 34.32 (64%)
#   qwen3-0.6B-q8_0    prompt (468 tokens)              497.3          103.1     4.82     290.4
#   qwen3-0.6B-q8_0    generate (64 tokens)              29.9           21.3     1.40      29.0  18.94 / 13.49 / 13.82 / 34.29 (55%)
#   qwen3-0.6B-q6_k    prompt (468 tokens)              487.3           73.8     6.60     290.5
#   qwen3-0.6B-q6_k    generate (64 tokens)              35.3           24.5     1.44      34.3  17.27 / 11.98 / 13.61 / 34.58 (50%)
#   qwen3-0.6B-q5_k_m  prompt (468 tokens)              503.5           66.5     7.57     293.4
#   qwen3-0.6B-q5_k_m  generate (64 tokens)              37.9           23.9     1.59      37.6  16.62 / 10.48 / 12.91 / 32.67 (51%)
#   qwen3-0.6B-q4_k_m  prompt (468 tokens)              487.0          100.8     4.83     299.0
#   qwen3-0.6B-q4_k_m  generate (64 tokens)              39.0           28.7     1.36      37.8  15.24 / 11.21 / 13.02 / 34.28 (44%)
#   qwen3-0.6B-q3_k_m  prompt (468 tokens)              476.5           74.7     6.38     292.8
#   qwen3-0.6B-q3_k_m  generate (64 tokens)              42.2           27.6     1.53      39.9  14.40 /  9.42 / 13.32 / 34.77 (41%)
#   qwen3-0.6B-q2_k    prompt (468 tokens)              414.3           78.8     5.26     281.4
#   qwen3-0.6B-q2_k    generate (64 tokens)              43.3           28.6     1.51      40.4  12.57 /  8.30 / 12.94 / 32.92 (38%)
#   qwen3-0.6B-q4_0    prompt (468 tokens)              483.2          100.3     4.82     274.9
#   qwen3-0.6B-q4_0    generate (64 tokens)              34.1           28.1     1.21      33.1  12.81 / 10.55 / 13.02 / 34.56 (37%)
#   gpt-oss-mxfp4      prompt (468 tokens)              720.0          133.4     5.40     509.6
#   gpt-oss-mxfp4      generate (64 tokens)              50.9           41.5     1.23      49.5  14.26 / 11.63 / 12.99 / 34.01 (42%)
# (Quantized prompts 1.41-1.76x of before; float prompts and every generation unchanged, within the run's noise.
# The same script with the AVX2-only build (/tmp AVX2 build of this tree, BEFORE= the same build of e96857b; llama.cpp
# still its AVX-512 kernels): q8_0 prompt 1.03x of before (the sign trick costs what int8 saves), q4_k_m 1.11x.
# With the row dots fetching 16 KiB ahead (d1db23d; 8 KiB in the table), QUANTS="q8_0 q4_k_m q2_k", later the same day,
# BEFORE= e96857b: generation bf16 19.0 tok/s (1.19x llama.cpp, 1.03x of before), q8_0 30.1 (1.42x, 1.06x), q4_k_m 43.4
# (1.41x, 1.03x), q2_k 49.2 (1.45x, 1.03x); prompts as in the table (q8_0 1.69x of before, q4_k_m 1.67x, q2_k 1.57x).
# Run benchmarks without OMP_WAIT_POLICY=PASSIVE: sleeping threads between the ~400 parallel regions of a token
# halved our generation in a run that had it set, not llama.cpp's, whose threads are its own.)
#
# The row dots' prefetches into L2 instead of L1 (matvec_dot.cpp's prefetch_ahead), measured 2026-12-07 on a 2-core
# Intel Xeon (Sapphire Rapids, 480 MiB L3), THREADS=2, REPS=3, TG=64, GPTOSS=1, QUANTS="f16 q8_0 q4_k_m q2_k",
# BEFORE= main before it (6bc54a7), in the same run:
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   before  GB/s ours / llama.cpp / memcpy / read stream
#   llama-98M          generate (64 tokens)               69.7           63.2     1.10     65.3  27.19 / 24.66 / 12.66 / 32.31 (84%)
#   qwen3-0.6B-bf16    generate (64 tokens)               21.3           15.2     1.40     18.2  25.39 / 18.12 / 12.87 / 28.85 (88%)
#   qwen3-0.6B-f16     generate (64 tokens)               19.6           14.5     1.35     16.8  23.37 / 17.29 / 12.79 / 32.77 (71%)
#   qwen3-0.6B-q8_0    generate (64 tokens)               30.1           20.3     1.48     29.1  19.07 / 12.86 / 13.32 / 34.29 (56%)
#   qwen3-0.6B-q4_k_m  generate (64 tokens)               42.5           28.6     1.49     41.7  16.61 / 11.18 / 13.48 / 35.22 (47%)
#   qwen3-0.6B-q2_k    generate (64 tokens)               50.3           32.6     1.54     47.2  14.60 /  9.46 / 13.09 / 33.81 (43%)
#   gpt-oss-mxfp4      generate (64 tokens)               60.8           43.0     1.41     52.3  17.03 / 12.05 / 11.87 / 31.57 (54%)
# (Prompts within 0.94-1.03x of before: they do not use the row dots. stories260K's generation, 1 MB, swings 2-3x
# between runs of either binary: thread wake-ups, not bytes.)
#
# gpt-oss with MXFP4 experts (GPTOSS=1 QWEN=0), measured 2026-12-07 on a 2-core Intel Xeon (AVX-512), THREADS=2,
# REPS=3, TG=64 (bytes per token: the experts a token uses, 4 of 16):
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   GB/s ours / llama.cpp / memcpy / read stream
#   gpt-oss-mxfp4      prompt (468 tokens)               451.0          154.3     2.92
#   gpt-oss-mxfp4      generate (64 tokens)               57.6           46.3     1.24   280.2 MB; 16.14 / 12.97 / 13.20 / 33.77 (48%)
# (Generation at half the read stream. perf, 128 tokens: 54% of the samples in the Q8_0 row dots (the 165 MB head and
# the attention, 198 MB a token), 23% in the MXFP4 ones (80 MB): the same time per byte, about 21 GB/s, where
# rp-bench ops' matvec streams a 512 MiB Q8_0 matrix at 28.6: the row dots, not the mixture's routing, set the pace.)
#
# Last measured on 2026-12-06 on a 2-core Intel Xeon (AVX-512 VNNI, BF16; 300 MiB L3), THREADS=2, REPS=3, TG=64,
# QUANTS="q8_0 q6_k q4_k_m q3_k_m q2_k q4_0", BEFORE= main before the row dots fetched their weights ahead (e48ad32:
# a per-row 2 KiB burst), in the same run:
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   before  GB/s ours / llama.cpp / memcpy / read stream
#   stories260K        generate (64 tokens)          11905.1         7134.4     1.67   11158.4  (1.0 MB: cache-resident)
#   llama-98M          generate (64 tokens)            119.7           99.2     1.21     110.2  46.7 / 38.7 / 15.1 / 38.4 (122% of the read stream)
#   qwen3-0.6B-bf16    prompt (468 tokens)             349.5          110.0     3.18     359.0
#   qwen3-0.6B-bf16    generate (64 tokens)             25.5           17.0     1.50      24.7  30.4 / 20.3 / 23.8 / 34.2 (89%)
#   qwen3-0.6B-q8_0    generate (64 tokens)             41.0           22.3     1.84      36.0  26.0 / 14.1 / 14.1 / 33.9 (77%)
#   qwen3-0.6B-q6_k    generate (64 tokens)             50.3           26.5     1.90      42.2  24.6 / 13.0 / 13.9 / 34.3 (72%)
#   qwen3-0.6B-q4_k_m  prompt (468 tokens)             356.4          119.1     2.99     364.5
#   qwen3-0.6B-q4_k_m  generate (64 tokens)             70.9           34.8     2.04      57.7  27.7 / 13.6 / 14.2 / 41.6 (67%)
#   qwen3-0.6B-q3_k_m  generate (64 tokens)             71.4           38.4     1.86      62.4  24.4 / 13.1 / 16.9 / 47.0 (52%)
#   qwen3-0.6B-q2_k    generate (64 tokens)             72.4           45.3     1.60      67.9  21.0 / 13.2 / 16.5 / 55.1 (38%)
#   qwen3-0.6B-q4_0    generate (64 tokens)             78.8           43.5     1.81      59.3  29.6 / 16.3 / 16.0 / 50.0 (59%)
# (Models under ~400 MB sit partly in the 300 MiB L3, so their "read stream" is faster than memory: the percentages
# of the smaller quants understate them; rp-bench ops --only matvec measures 512 MiB matrices. Prompts: 3.0-4.5x
# llama.cpp, 0.94-1.04x of before, within the run's noise.)
#
# Measured on 2026-12-02 on a 2-core Intel Xeon (AVX-512 VNNI and BF16), THREADS=2, REPS=3, TG=64; the
# small models with BEFORE= main at the start of the day's second session (36d5d35), the 0.6B models in a run
# an hour earlier (before generation replayed its graph, which only saves the per-token graph building):
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   before  GB/s ours / llama.cpp / memcpy / read stream
#   stories260K        prompt (840 tokens)           33147.4         2935.1    11.29   20173.9
#   stories260K        generate (64 tokens)          10317.3         2344.6     4.40    2840.4   (1.0 MB: cache-resident)
#   llama-98M          prompt (840 tokens)             826.5          270.0     3.06     802.5
#   llama-98M          generate (64 tokens)             62.9           56.3     1.12      57.9   24.5 / 22.0 / 12.4 / 26.0 (198% of memcpy)
#   qwen3-0.6B-bf16    prompt (468 tokens)             187.3           69.0     2.71
#   qwen3-0.6B-bf16    generate (64 tokens)             17.8           13.4     1.33             21.2 / 16.0 / 11.7 / 25.7 (181%)
#   qwen3-0.6B-q8_0    prompt (468 tokens)             207.7           85.8     2.42
#   qwen3-0.6B-q8_0    generate (64 tokens)             27.4           18.0     1.52             17.4 / 11.4 / 11.6 / 24.3 (149%)
#   qwen3-0.6B-q4_k_m  prompt (468 tokens)             215.7           81.5     2.65
#   qwen3-0.6B-q4_k_m  generate (64 tokens)             35.9           22.7     1.58             14.0 /  8.9 / 10.4 / 23.8 (136%)
#   qwen3-0.6B-q3_k_m  prompt (468 tokens)             200.4           53.9     3.72
#   qwen3-0.6B-q3_k_m  generate (64 tokens)             32.4           27.3     1.19             11.1 /  9.3 /  7.2 / 14.8 (154%)
#   qwen3-0.6B-q2_k    prompt (468 tokens)             187.4           57.1     3.28
#   qwen3-0.6B-q2_k    generate (64 tokens)             34.5           26.6     1.30             10.0 /  7.7 / 10.8 / 22.5 (93%)
# (The stories260K generation is no longer graph building: 2.8k -> 10.3k tok/s. The K-quants are decode-bound,
# 45-75% of the read stream.)
#
# Measured earlier the same day on a 2-core AMD EPYC (Zen 1: AVX2, no AVX-512, 8 MiB L3), THREADS=2, REPS=3,
# TG=64, with BEFORE= the previous main (whose generation, without AVX-512, went through the packed GEMM):
#   model              measure                    ours tok/s llama.cpp tok/s    ratio   before
#   stories260K        prompt (840 tokens)           14557.7         1765.4     8.25   10400.1
#   stories260K        generate (64 tokens)           2181.3      (see note)            1912.6
#   llama-98M          prompt (840 tokens)             283.8          117.2     2.42     281.6
#   llama-98M          generate (64 tokens)             47.2           48.6     0.97      19.1   18.4 GB/s, 89% of the read stream
#   qwen3-0.6B-bf16    prompt (468 tokens)              67.7           16.6     4.08      60.7
#   qwen3-0.6B-bf16    generate (64 tokens)             15.0           10.0     1.50       3.2   17.9 GB/s, 76%
#   qwen3-0.6B-q8_0    prompt (468 tokens)              68.9           28.4     2.43      65.2
#   qwen3-0.6B-q8_0    generate (64 tokens)             19.8           19.4     1.02       2.9   12.5 GB/s, 64%
#   qwen3-0.6B-q4_k_m  prompt (468 tokens)              68.1           28.8     2.36      64.3
#   qwen3-0.6B-q4_k_m  generate (64 tokens)             22.4           25.1     0.89       2.1    8.8 GB/s, 47% (decode-bound)
#   qwen3-0.6B-q3_k_m  prompt (468 tokens)              68.1           27.2     2.50      69.6
#   qwen3-0.6B-q3_k_m  generate (64 tokens)             20.9           22.4     0.93       2.1    7.1 GB/s, 30% (decode-bound)
#   qwen3-0.6B-q2_k    prompt (468 tokens)              59.2           28.9     2.05      65.2
#   qwen3-0.6B-q2_k    generate (64 tokens)             21.1           23.4     0.90       1.9    6.1 GB/s, 27% (decode-bound)
# (read-only stream of 1.2 GB: 23.5 GB/s, memcpy 13.7. llama.cpp's stories260K generation figure came out as 55
# tok/s in this run, a glitch of the wall-time difference; it measured 3553 in the run before. Prompts on the 0.6B
# models are bound by the FMA units: our GEMM runs at 70 GFLOP/s of a 79 GFLOP/s peak, as OpenBLAS does.)
#
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
THREADS=${THREADS:-2}
TG=${TG:-64}
REPS=${REPS:-3}
SHARED=${RP_SHARED_DIR:-$(cd "$ROOT/../shared" 2>/dev/null && pwd || echo /work/shared)}
GEN="$BUILD/bin/rp-generate"
GEN_BEFORE=""
if [[ -n "${BEFORE:-}" ]]; then
  GEN_BEFORE="$(cd "$BEFORE" && pwd)/bin/rp-generate"
  [[ -x "$GEN_BEFORE" ]] || { echo "error: BEFORE=$BEFORE has no bin/rp-generate" >&2; exit 1; }
fi
ORACLE="$BUILD/bin/rp-oracle"
PROMPT_FILE="$SHARED/models/reference/train.txt"
STORIES="$SHARED/models/stories260K.gguf"

die() { echo "error: $*" >&2; exit 1; }
[[ -x "$GEN" ]] || die "$GEN not found (cmake --build $BUILD --target rp-generate)"
[[ -x "$ORACLE" ]] || die "$ORACLE not found (scripts/fetch-oracle.sh, reconfigure, build rp-oracle)"
[[ -f "$PROMPT_FILE" && -f "$STORIES" ]] || die "shared models not found under $SHARED (set RP_SHARED_DIR)"

if [[ -z "${WORK:-}" ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rp-bench-infer-XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"

# The models: the synthetic-model writer (rp-gguf synth), 97.9M parameters with the stories260K vocabulary;
# with QWEN=1 (the default) also a Qwen3-0.6B-shaped bf16 model with the real 151,936-token vocabulary
# (1.2 GB, its tied head read whole for every token) and its QUANTS (rp-gguf convert mixes; default
# q8_0 q4_k_m q3_k_m q2_k).
BIG="$WORK/llama-98M.gguf"
"$BUILD/bin/rp-gguf" synth "$BIG" --vocab "$STORIES" --shape llama-98m --seed 42 || die "rp-gguf synth failed"
MODELS=("$STORIES" "$BIG")
if [[ "${QWEN:-1}" == 1 ]]; then
  QVOCAB="$SHARED/models/vocab/ggml-vocab-qwen2.gguf"
  [[ -f "$QVOCAB" ]] || die "$QVOCAB not found"
  "$BUILD/bin/rp-gguf" synth "$WORK/qwen3-0.6B-bf16.gguf" --vocab "$QVOCAB" --shape qwen3-0.6b --type bf16 --seed 42 >/dev/null ||
    die "rp-gguf synth (qwen3-0.6b) failed"
  MODELS+=("$WORK/qwen3-0.6B-bf16.gguf")
  for q in ${QUANTS:-q8_0 q4_k_m q3_k_m q2_k}; do
    "$BUILD/bin/rp-gguf" convert "$WORK/qwen3-0.6B-bf16.gguf" "$WORK/qwen3-0.6B-$q.gguf" --type "$q" >/dev/null ||
      die "rp-gguf convert --type $q failed"
    MODELS+=("$WORK/qwen3-0.6B-$q.gguf")
  done
fi

if [[ "${GPTOSS:-0}" == 1 ]]; then
  QVOCAB="$SHARED/models/vocab/ggml-vocab-qwen2.gguf"
  "$BUILD/bin/rp-gguf" synth "$WORK/gpt-oss-bf16.gguf" --arch gpt-oss --vocab "$QVOCAB" --n-embd 1024 --n-head 16 --n-head-kv 4 \
    --head-dim 64 --n-layer 12 --experts 16 --experts-used 4 --expert-ff 1024 --n-ctx 4096 --type bf16 --seed 42 >/dev/null ||
    die "rp-gguf synth (gpt-oss) failed"
  "$BUILD/bin/rp-gguf" convert "$WORK/gpt-oss-bf16.gguf" "$WORK/gpt-oss-mxfp4.gguf" --type mxfp4_moe >/dev/null ||
    die "rp-gguf convert --type mxfp4_moe failed"
  rm -f "$WORK/gpt-oss-bf16.gguf"
  MODELS+=("$WORK/gpt-oss-mxfp4.gguf")
fi

now() { date +%s.%N; }
best_max() { sort -g | tail -1; }   # best of several tokens/s figures

ours_prompt() {   # tokens/s [of the rp-generate in $2]
  "${2:-$GEN}" -m "$1" -f "$PROMPT_FILE" -n 1 -t "$THREADS" --temp 0 --seed 1 2>&1 >/dev/null |
    sed -n 's/.*(prompt: \([0-9.]*\) tokens\/s).*/\1/p'
}
ours_gen() {      # "tokens/s n_generated" [of the rp-generate in $2]
  "${2:-$GEN}" -m "$1" -p "Once upon a time" -n "$TG" -t "$THREADS" --temp 0 --seed 1 2>&1 >/dev/null |
    sed -n 's/^\([0-9]*\) tokens, \([0-9.]*\) tokens\/s.*/\2 \1/p'
}
llama_prompt() {  # "tokens/s n_tokens"
  "$ORACLE" logits "$1" --prompt-file "$PROMPT_FILE" --threads "$THREADS" |
    sed -n 's/^timing: .*decode(\([0-9]*\) tok) \([0-9.]*\) ms.*/\1 \2/p' | awk '{ printf "%.1f %d\n", $1 * 1000 / $2, $1 }'
}
llama_wall() {    # seconds for generate -n $2
  local t0 t1
  t0=$(now)
  "$ORACLE" generate "$1" --prompt "Once upon a time" -n "$2" --ignore-eos --threads "$THREADS" >/dev/null
  t1=$(now)
  echo "$t1 - $t0" | bc -l
}
llama_gen() {     # tokens/s: (wall(TG) - wall(0)) / TG, each wall time the minimum of REPS runs
  local w0 w1
  w0=$(for _ in $(seq "$REPS"); do llama_wall "$1" 0; done | sort -g | head -1)
  w1=$(for _ in $(seq "$REPS"); do llama_wall "$1" "$TG"; done | sort -g | head -1)
  echo "$TG / ($w1 - $w0)" | bc -l | xargs printf "%.1f\n"
}

# Weight bytes one generated token reads: every tensor but token_embd (one row), which counts when tied; of a
# mixture's expert tensors (*_exps), the share of the experts a token uses.
weight_bytes() {
  "$BUILD/bin/rp-gguf" info "$1" | awk '
    /\.expert_count / { experts = $NF } /\.expert_used_count / { used = $NF }
    /^ +[0-9]+ +[^ ]+ +[a-z0-9_]+ +\[/ { name = $2; b = $(NF - 1); bytes[name] = b; if (name ~ /_exps\./) moe += b; else total += b }
    END { if ("output.weight" in bytes) total -= bytes["token_embd.weight"]; if (experts > 0) total += moe * used / experts
          printf "%d\n", total }'
}
# "memcpy_GB/s read_GB/s" of about `bytes` on THREADS threads (rp-bench gguf's buffer of that many MiB, at
# least 16): a copy of the bytes, and a stream that only reads them (the limit of work reading each byte once).
stream_gbps() {
  local mb=$(( $1 / 1048576 )); (( mb < 16 )) && mb=16
  "$BUILD/bin/rp-bench" gguf --size "$mb" --reps "$REPS" --threads "$THREADS" | awk -v t="$THREADS" '
    $0 ~ "^  memcpy, " t " thread" { for (i = 1; i <= NF; ++i) if ($i == "GB/s") m = $(i - 1) }
    $0 ~ "^  read, " t " thread" { for (i = 1; i <= NF; ++i) if ($i == "GB/s") r = $(i - 1) }
    END { print m, r }'
}

printf "threads %s, best of %s, %s generated tokens; host %s, load %s\n" "$THREADS" "$REPS" "$TG" \
  "$(nproc) cores" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-18s %-22s %14s %14s %8s   %s\n" model measure "ours tok/s" "llama.cpp tok/s" ratio \
  "(generate: weight MB/token; GB/s ours / llama.cpp / memcpy / read-only stream of that size)"
for m in "${MODELS[@]}"; do
  name=$(basename "$m" .gguf)
  op=$(for _ in $(seq "$REPS"); do ours_prompt "$m"; done | best_max)
  lp=$(for _ in $(seq "$REPS"); do llama_prompt "$m"; done | sort -g -k1 | tail -1)
  og=$(for _ in $(seq "$REPS"); do ours_gen "$m"; done | sort -g -k1 | tail -1)
  lg=$(llama_gen "$m")
  n_prompt=${lp#* }
  printf "%-18s %-22s %14s %14s %8.2f" "$name" "prompt ($n_prompt tokens)" "$op" "${lp%% *}" "$(echo "$op / ${lp%% *}" | bc -l)"
  if [[ -n "$GEN_BEFORE" ]]; then
    bp=$(for _ in $(seq "$REPS"); do ours_prompt "$m" "$GEN_BEFORE"; done | best_max)
    printf "   before: %s tok/s (now %.2fx)" "$bp" "$(echo "$op / $bp" | bc -l)"
  fi
  printf "\n"
  wb=$(weight_bytes "$m")
  read -r mc rd <<< "$(stream_gbps "$wb")"
  bw=$(awk -v b="$wb" -v o="${og%% *}" -v l="$lg" -v m="$mc" -v r="$rd" 'BEGIN {
    printf "%.1f MB; %.2f / %.2f / %.2f / %.2f GB/s (ours %.0f%% of memcpy, %.0f%% of the read stream)", b / 1e6,
      b * o / 1e9, b * l / 1e9, m, r, 100 * b * o / 1e9 / m, 100 * b * o / 1e9 / r }')
  printf "%-18s %-22s %14s %14s %8.2f   %s" "$name" "generate (${og#* } tokens)" "${og%% *}" "$lg" "$(echo "${og%% *} / $lg" | bc -l)" "$bw"
  if [[ -n "$GEN_BEFORE" ]]; then
    bg=$(for _ in $(seq "$REPS"); do ours_gen "$m" "$GEN_BEFORE"; done | sort -g -k1 | tail -1)
    printf "   before: %s tok/s (now %.2fx)" "${bg%% *}" "$(echo "${og%% *} / ${bg%% *}" | bc -l)"
  fi
  printf "\n"
done
