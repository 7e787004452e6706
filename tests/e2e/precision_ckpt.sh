#!/usr/bin/env bash
# precision_ckpt.sh TRAIN_GPT PLAN
# The trainers' --dtype bfloat16 checkpoints (issue 34, items 3 and 5), 2
# thread ranks: with float32 masters, a run saved at step 3 and resumed to
# step 6 prints the losses of an uninterrupted run (the masters and the
# optimizer state are saved in float32, the model is their rounding); a
# pure bfloat16 checkpoint (--master bfloat16) loaded where float32 masters
# are expected is one line naming the parameter and both dtypes, trains no
# step and leaves the checkpoint as it was; loaded pure, it trains on.
set -u
TRAIN=$1 PLAN=$2
source "$(dirname "$0")/ckpt_common.sh" precision-ckpt
train=("$TRAIN" --config context=16,embed=32,mlp=64 --batch 4 --log-every 1 --ranks 2 --plan "$PLAN"
  --dtype bfloat16)

run reference "${train[@]}" --steps 6
run first "${train[@]}" --steps 3 --save "$WORK/masters"
run resumed "${train[@]}" --steps 6 --load "$WORK/masters"
grep -qE "^resumed from [^ ]*/masters at step 3$" "$WORK/resumed.log" || fail "did not resume at step 3"
same_losses "$WORK/reference.log" "$WORK/first.log" 3
same_losses "$WORK/reference.log" "$WORK/resumed.log" 3
echo "float32 masters: saved at step 3, resumed to 6, the losses of the uninterrupted run"

run pure "${train[@]}" --master bfloat16 --steps 3 --save "$WORK/pure"
before=$(cd "$WORK/pure" && cksum ./* | sort)
"${train[@]}" --steps 6 --load "$WORK/pure" >"$WORK/refused.log" 2>&1 && fail "loading a bfloat16 checkpoint into float32 masters succeeded"
errors=$(grep -c "error" "$WORK/refused.log")
[[ $errors -eq 1 ]] || fail "expected one error line, got $errors"
grep -qE "^train_gpt: error: .*'[^']+' is bfloat16 in the checkpoint but the optimizer keeps float32 master weights" \
  "$WORK/refused.log" || fail "the error does not name the parameter and the dtypes"
grep -qE "^step " "$WORK/refused.log" && fail "a step was trained after the refused load"
[[ $(cd "$WORK/pure" && cksum ./* | sort) == "$before" ]] || fail "the refused load changed the checkpoint"
echo "a pure bfloat16 checkpoint where float32 masters are expected: $(grep error "$WORK/refused.log")"

run pure_again "${train[@]}" --master bfloat16 --steps 4 --load "$WORK/pure"
grep -qE "^step +4 " "$WORK/pure_again.log" || fail "the pure bfloat16 checkpoint did not train on with --master bfloat16"
echo "loaded with --master bfloat16 it trains on"
