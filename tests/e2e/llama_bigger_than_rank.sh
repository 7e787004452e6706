#!/usr/bin/env bash
# A Llama larger than one rank's memory runs under tensor parallelism
# (docs/WEIGHTS.md, "A model larger than one rank"). Weights of a ~490 MB
# model are written once; then every process gets the same limit on its
# private memory (prlimit --data, RLIMIT_DATA: the file's read-only mapping
# does not count, the tensors do), set halfway between what one process
# needs for the whole model and what one of 2 ranks needs, both measured
# here first without a limit (peak VmData, sampled), so the test follows
# this machine's baseline (libtorch, OpenBLAS's buffers) instead of a
# constant. Under the limit the unsharded run must fail with the clear
# out-of-memory line, and 2 and 4 gloo processes must load (DeferredInit:
# no rank ever holds the whole model) and generate the unsharded text.
# usage: llama_bigger_than_rank.sh TRAIN_MODEL SHARDPLAN_CLI PLAN WORK_DIR
set -uo pipefail
train=$1 cli=$2 plan=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
config=embed=1024,heads=16,kv_heads=4,layers=8,mlp=4096,context=64
gen=(--model llama --load-weights "$work/w" --steps 0 --generate 4 --samples 1 --temperature 0 --prompt Hello)

"$train" --model llama --config $config --steps 1 --batch 1 --optimizer sgd --save-weights "$work/w" \
  >"$work/write.txt" 2>&1 || { cat "$work/write.txt"; exit 1; }
model_kb=$(($(stat -c %s "$work/w/model.safetensors") / 1024))

source "$(dirname "$0")/peak_vmdata.sh"
whole=$(peak_vmdata "$train" "${gen[@]}")
want=$(sed -n 's/^sample 1: "\(.*\)"$/\1/p' "$work/peak.txt")
half=$(peak_vmdata "$cli" launch -n 2 --backend gloo -- "$train" "${gen[@]}" --plan "$plan")
echo "model $model_kb kB; peak VmData: unsharded $whole kB, one of 2 ranks $half kB"
if [ "$whole" -eq 0 ] || [ "$half" -eq 0 ] || [ -z "$want" ]; then echo "FAIL: a run without a limit failed"; exit 1; fi
if [ $((whole - half)) -lt $((model_kb / 3)) ]; then
  echo "FAIL: 2 ranks saved $((whole - half)) kB of $model_kb kB each: the shards do not replace the whole model"
  exit 1
fi
limit=$(((whole + half) / 2 * 1024))
echo "limit: --data=$limit bytes per process (the model is $((model_kb * 1024)) bytes)"

failures=0
out=$(prlimit --data=$limit timeout 300 "$train" "${gen[@]}" 2>&1)
rc=$?
line=$(grep -m1 "out of memory giving parameter" <<<"$out")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -n "$line" ]; then
  echo "ok   unsharded under the limit fails: $line"
else
  echo "FAIL unsharded under the limit: exit $rc, no out-of-memory line"; echo "$out" | tail -5
  failures=$((failures + 1))
fi
# The automatic plan probes the deferred model's graph before any rank holds
# a shard: it must find the written plan's cut without the weights.
for run in "2 $plan" "4 $plan" "2 auto"; do
  set -- $run
  out=$(prlimit --data=$limit timeout 300 "$cli" launch -n $1 --backend gloo -- "$train" "${gen[@]}" --plan "$2" 2>&1)
  got=$(sed -n 's/^\[rank 0\] sample 1: "\(.*\)"$/\1/p' <<<"$out")
  if [ "$got" = "$want" ]; then
    echo "ok   $1 gloo processes, plan $(basename "$2"), under the limit: '$got'"
  else
    echo "FAIL $1 gloo processes, plan $(basename "$2"), under the limit: expected '$want', got '$got'"
    echo "$out" | tail -5
    failures=$((failures + 1))
  fi
done
exit $((failures > 0))
