#!/usr/bin/env bash
# ckpt_zero_optimizers.sh TRAIN_GPT ZERO_PLAN
# ZeRO-1 checkpoints with every element-wise optimizer ZeroOptimizer takes
# beyond SGD and Adam (AdamW, RMSprop, Adagrad; the last two used to train
# and then fail at the first save): 2 thread ranks save every 2 steps up to
# step 4, resume to step 6, and every step's loss equals an uninterrupted
# single-process run's (float64).
set -u
TRAIN=$1
PLAN=$2
source "$(dirname "$0")/ckpt_common.sh" ckpt-zero-opt
for opt in adamw rmsprop adagrad; do
  train=("$TRAIN" --config context=16,embed=32,mlp=64 --dtype float64 --batch 8 --log-every 1 --optimizer "$opt")
  run "${opt}_reference" "${train[@]}" --steps 6
  run "${opt}_first" "${train[@]}" --ranks 2 --plan "$PLAN" --steps 4 --save "$WORK/$opt" --save-every 2
  grep -q "saved $WORK/$opt at step 2" "$WORK/${opt}_first.log" || fail "$opt: no save at step 2"
  run "${opt}_resumed" "${train[@]}" --ranks 2 --plan "$PLAN" --steps 6 --load "$WORK/$opt"
  cat "$WORK/${opt}_first.log" "$WORK/${opt}_resumed.log" >"$WORK/${opt}_chain.txt"
  same_losses "$WORK/${opt}_reference.log" "$WORK/${opt}_chain.txt" 6
  echo "ok: $opt under ZeRO-1 saves, resumes and matches one process for 6 steps"
done
