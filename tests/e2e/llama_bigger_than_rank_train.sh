#!/usr/bin/env bash
# A Llama whose training state is larger than one rank's memory trains
# (issue 35 item 4; the inference counterpart is llama_bigger_than_rank.sh).
# Weights are written once; every process then gets the same limit on its
# private memory (prlimit --data, RLIMIT_DATA), set halfway between the peak
# VmData of one rank of {data: 2, model: 2} with ZeRO-1 and with ZeRO-3, both
# with every block recomputed and measured here first without a limit over
# 2 steps (the first optimizer step allocates the last state), so that the
# limit follows this machine's baseline (libtorch, OpenBLAS, gloo's buffers)
# instead of a constant. Per parameter, float64 Adam, T = D = 2: ZeRO-1 holds
# 8/T + 8/T + 16/(T D) = 12 bytes, ZeRO-3 32/(T D) = 8; the whole model's
# state in one process would be 32 (float32: 16). Under the limit ZeRO-3
# trains 20 steps with the unsharded process' losses (float64, 1e-10
# relative: only the sums' order differs), and ZeRO-1 stops with the clear
# out-of-memory line (examples/models/out_of_memory.h) naming what did not fit.
# DeferredInit: no rank ever holds the whole model (--load-weights), and with
# ZeRO-3 not even its whole shard: it loads its slices of it only.
# usage: llama_bigger_than_rank_train.sh TRAIN_MODEL SHARDPLAN_CLI ZERO3_PLAN ZERO1_PLAN LOSSES_MATCH WORK_DIR
set -uo pipefail
train=$1 cli=$2 zero3=$3 zero1=$4 losses_match=$5 work=$6
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
config=embed=1024,heads=16,kv_heads=4,layers=4,mlp=4096,context=16
run=(--model llama --load-weights "$work/w" --steps 20 --log-every 1 --batch 4 --optimizer adam --lr 0.001)
# The limit is about the training state, not glibc's free lists: blocks of
# 4 MiB and more (every parameter, gradient and moment of this model, not
# the activations) get their own mapping, returned when freed, so VmData
# follows the live tensors instead of a heap fragmented by the load.
launch=(env MALLOC_MMAP_THRESHOLD_=4194304 "$cli" launch -n 4 --backend gloo --)

"$train" --model llama --config $config --steps 1 --batch 1 --optimizer sgd --save-weights "$work/w" \
  >"$work/write.txt" 2>&1 || { cat "$work/write.txt"; exit 1; }
model_kb=$(($(stat -c %s "$work/w/model.safetensors") / 1024))  # float32: 4 bytes per parameter

source "$(dirname "$0")/peak_vmdata.sh"
# Rank 0's bytes copied at load ("rank 0 copied N bytes"), from the last run's output.
copied() { grep -o "rank 0 copied [0-9]* bytes" "$work/peak.txt" | grep -o "[0-9][0-9]*" | tail -1; }
z3=$(peak_vmdata "${launch[@]}" "$train" "${run[@]}" --dtype float64 --steps 2 --plan "$zero3")
c3=$(copied)
z1=$(peak_vmdata "${launch[@]}" "$train" "${run[@]}" --dtype float64 --steps 2 --plan "$zero1")
c1=$(copied)
echo "model $model_kb kB (float32); peak VmData of a rank over 2 steps: ZeRO-1 $z1 kB, ZeRO-3 $z3 kB"
if [ "$z1" -eq 0 ] || [ "$z3" -eq 0 ]; then echo "FAIL: a run without a limit failed"; exit 1; fi
# ZeRO-3 loads into the slices: rank 0 copies half its shard (D = 2; the
# norms' slices round up), ZeRO-1 all of it.
echo "rank 0 copied at load: ZeRO-1 ${c1:-?} bytes (its shard), ZeRO-3 ${c3:-?} bytes (its slices)"
if [ -z "$c1" ] || [ -z "$c3" ] || [ $((c3 * 2)) -gt $((c1 + c1 / 100)) ]; then
  echo "FAIL: a ZeRO-3 rank copied more than its half of its shard at load"
  exit 1
fi
# Theory: ZeRO-3 saves 4 float64 bytes per parameter, the float32 file's size.
if [ $((z1 - z3)) -lt $((model_kb / 2)) ]; then
  echo "FAIL: ZeRO-3 saved $((z1 - z3)) kB of the $model_kb kB theory: its slices do not replace the whole state"
  exit 1
fi
limit=$(((z1 + z3) / 2 * 1024))
echo "limit: --data=$limit bytes per process; the model's Adam state is $((model_kb * 4 * 1024)) bytes in float32"

failures=0
# "$1" (a description) under the limit must stop with the out-of-memory line.
expect_out_of_memory() {
  local what=$1 out rc line
  shift
  out=$(prlimit --data=$limit timeout 200 "$@" 2>&1)
  rc=$?
  line=$(grep -m1 "error: .*out of memory giving" <<<"$out")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -n "$line" ] && ! grep -q "Exception raised from\|bad_alloc\|terminate called" <<<"$out"; then
    echo "ok   $what under the limit fails: $line"
  else
    echo "FAIL $what under the limit: exit $rc, no clear out-of-memory line"; echo "$out" | tail -8
    failures=$((failures + 1))
  fi
}
# The whole float32 training state in one process does not fit.
expect_out_of_memory "one process, float32" env MALLOC_MMAP_THRESHOLD_=4194304 "$train" "${run[@]}" --dtype float32
if "$losses_match" 1e-10 -- "$train" "${run[@]}" --dtype float64 -- prlimit --data=$limit "${launch[@]}" "$train" \
  "${run[@]}" --dtype float64 --plan "$zero3" >"$work/zero3.txt" 2>&1; then
  echo "ok   ZeRO-3 + recompute, 4 gloo processes under the limit: the unsharded losses, 20 steps"
else
  echo "FAIL ZeRO-3 + recompute under the limit:"; tail -25 "$work/zero3.txt"
  failures=$((failures + 1))
fi
expect_out_of_memory "ZeRO-1 + recompute, 4 gloo processes," "${launch[@]}" "$train" "${run[@]}" --dtype float64 --plan "$zero1"
exit $((failures > 0))
