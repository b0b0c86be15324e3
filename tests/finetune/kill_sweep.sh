#!/usr/bin/env bash
# kill -9 at random moments, then --resume: the result must be the uninterrupted run's bytes.
#   tests/finetune/kill_sweep.sh BUILD_DIR KILLS [SEED]          env: STEPS (30), RP_SHARED_DIR
# Modes in turn: the host, 3 CPU devices sync, 3 devices async. Every kill is SIGKILL: at a random time
# (uniform over 30-95% of the uninterrupted run's time), or, every third kill, inside a checkpoint write (RP_TEST_KILL_AT_COMMIT:
# the temporary file complete, not yet renamed). After each kill the run is resumed from whatever checkpoint
# is in place (or started over when none is) until it finishes; its adapter must equal the reference's.
# Prints one line per kill and a summary; exits 1 at the first mismatch.
set -euo pipefail
build=${1:?usage: kill_sweep.sh BUILD_DIR KILLS [SEED]}
kills=${2:?usage: kill_sweep.sh BUILD_DIR KILLS [SEED]}
seed=${3:-1}
steps=${STEPS:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${RP_SHARED_DIR:-$root/../shared}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmd=("$build/bin/rp-finetune" -m "$shared/models/stories260K.gguf" --data "$shared/models/reference/train.txt"
     --seq-len 16 --batch 2 --steps "$steps" -t 1 --lora-rank 4 --save-every 1)
modes=("" "--devices 3" "--devices 3 --async")
RANDOM=$seed
declare -A ref_time
for m in "${modes[@]}"; do
  key=m${m// /_}
  start=$(date +%s%N)
  "${cmd[@]}" -o "$tmp/ref$key.gguf" $m >/dev/null 2>&1
  ref_time[$key]=$(( ($(date +%s%N) - start) / 1000000 ))
done
ok=0 in_write=0 with_ckpt=0 missed=0
for ((k = 0; k < kills; ++k)); do
  m=${modes[$((k % 3))]}
  key=m${m// /_}
  out=$tmp/run$k
  mkdir -p "$out"
  if (( k % 3 == 2 )); then  # inside the Nth commit: a checkpoint, or the final files
    at=$(( 1 + RANDOM % (steps + 3) ))
    { RP_TEST_KILL_AT_COMMIT=$at "${cmd[@]}" -o "$out/a.gguf" $m >/dev/null 2>&1; } 2>/dev/null && rc=0 || rc=$?
    how="at commit $at"
    in_write=$((in_write + 1))
  else
    ms=$(( ref_time[$key] * 30 / 100 + RANDOM % (ref_time[$key] * 65 / 100 + 1) ))
    ( "${cmd[@]}" -o "$out/a.gguf" $m >/dev/null 2>&1 & pid=$!; sleep "$(awk -v t=$ms 'BEGIN {printf "%.3f", t / 1000}')";
      kill -9 $pid 2>/dev/null; wait $pid ) 2>/dev/null && rc=0 || rc=$?
    how="after $ms ms"
  fi
  resumes=0
  [ "$rc" = 0 ] && missed=$((missed + 1))
  while [ ! -f "$out/a.gguf" ]; do
    if [ -f "$out/a.gguf.ckpt.gguf" ]; then
      with_ckpt=$((with_ckpt + 1))
      "${cmd[@]}" -o "$out/a.gguf" $m --resume "$out/a.gguf.ckpt.gguf" >"$out/resume.log" 2>&1 || { echo "kill $k ($m, $how): resume failed:"; cat "$out/resume.log"; exit 1; }
    else
      "${cmd[@]}" -o "$out/a.gguf" $m >"$out/resume.log" 2>&1 || { echo "kill $k: restart failed"; cat "$out/resume.log"; exit 1; }
    fi
    resumes=$((resumes + 1))
  done
  if cmp -s "$out/a.gguf" "$tmp/ref$key.gguf"; then
    ok=$((ok + 1))
    echo "kill $k (${m:-host}, $how, exit $rc): $resumes resume(s), same bytes"
  else
    echo "kill $k (${m:-host}, $how, exit $rc): DIFFERENT bytes after $resumes resume(s)"
    exit 1
  fi
  rm -rf "$out"
done
echo "kill_sweep: $ok/$kills kills resumed to the uninterrupted bytes ($in_write inside a commit, $with_ckpt resumes from a checkpoint, $missed runs finished before their kill)"
