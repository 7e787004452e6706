#!/usr/bin/env bash
# ckpt_pipeline.sh SHARDPLAN TRAIN_GPT PLANS_DIR
# Checkpoints of pipelined runs (docs/CHECKPOINTS.md, "Pipelines"): the GPT
# with plans/gpt_pipe_3d.yaml ({data: 2, pipe: 2, model: 2}, 8 thread ranks)
# saves every 2 steps and stops at step 3; --resume auto goes on at {pipe: 2}
# (plans/gpt_pipe.yaml), at {model: 2} (plans/gpt.yaml), in one process
# without a plan, and at {pipe: 2} as gloo processes, each saving where it
# stops: every step's loss is an uninterrupted one-process run's (float64,
# Adam). Each stage line says the rank holds its stage's parameters only.
set -u
SP=$1
TRAIN=$2
PLANS=$3
source "$(dirname "$0")/ckpt_common.sh" ckpt-pipeline

train=("$TRAIN" --config context=16,embed=32,mlp=64,heads=4,layers=2 --dtype float64 --batch 8 --log-every 1
  --optimizer adam --lr 0.01)
resume=(--save "$WORK/ckpt" --resume auto)
resumed_at() { grep -qE "^resumed from [^ ]*/ckpt at step $2$" "$WORK/$1.log" || fail "$1 did not resume at step $2"; }

run reference "${train[@]}" --steps 10
run pipe_3d "${train[@]}" --ranks 8 --plan "$PLANS/gpt_pipe_3d.yaml" --steps 3 --save "$WORK/ckpt" --save-every 2
# Each of the 8 ranks holds its stage's parameters only: 8 bytes (float64)
# a parameter of its stage, not the whole model's.
held=$(awk '/^rank [0-9]+: stage [0-9]+, pieces/ { n++; gsub(/\(/, "", $9); if ($9 != 8 * $7) bad = bad " " $1 $2 }
  END { print n + 0, (bad == "" ? "ok" : bad) }' "$WORK/pipe_3d.log")
[[ $held == "8 ok" ]] || fail "the stage lines do not say each rank holds its stage's parameters only: $held"
ls -d "$WORK/ckpt.step-2" >/dev/null 2>&1 || fail "--save-every 2 kept no step-2 checkpoint"
run pipe_2 "${train[@]}" --ranks 2 --plan "$PLANS/gpt_pipe.yaml" --steps 5 "${resume[@]}"
resumed_at pipe_2 3
run model_2 "${train[@]}" --ranks 2 --plan "$PLANS/gpt.yaml" --steps 6 "${resume[@]}"
resumed_at model_2 5
run plain "${train[@]}" --steps 8 "${resume[@]}"
resumed_at plain 6
run pipe_gloo "$SP" launch -n 2 --backend gloo -- "${train[@]}" --plan "$PLANS/gpt_pipe.yaml" --steps 10 "${resume[@]}"
grep -qE "resumed from [^ ]*/ckpt at step 8$" "$WORK/pipe_gloo.log" || fail "pipe_gloo did not resume at step 8"

cat "$WORK"/{pipe_3d,pipe_2,model_2,plain,pipe_gloo}.log >"$WORK/chain.txt"
same_losses "$WORK/reference.log" "$WORK/chain.txt" 10
echo "ok: 10 steps through {data: 2, pipe: 2, model: 2} -> {pipe: 2} -> {model: 2} -> one process -> {pipe: 2} on gloo match the uninterrupted run"
