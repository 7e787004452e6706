#!/usr/bin/env bash
# after_training.sh TRAIN_GPT
# A failure after the last step (forced by the test hook
# SHARDPLAN_TEST_FAIL_AFTER_TRAINING=1) keeps the trained model: with --save
# the checkpoint of the last step is there and the message says how to go on
# from it (which then works, generating without training); without --save
# the message says how to keep it next time.
set -u
TRAIN=$1
source "$(dirname "$0")/ckpt_common.sh" after-training
train=("$TRAIN" --config context=16,embed=32,mlp=64 --batch 4 --log-every 1)
expect_failure() {  # expect_failure NAME PATTERN CMD...
  local name=$1 pattern=$2
  shift 2
  SHARDPLAN_TEST_FAIL_AFTER_TRAINING=1 "$@" >"$WORK/$name.log" 2>&1 && fail "$name: succeeded"
  grep -q "^step    3 " "$WORK/$name.log" || fail "$name: did not train 3 steps"
  grep -qE "$pattern" "$WORK/$name.log" || fail "$name: no line matching '$pattern'"
}
expect_failure unsaved "^train_gpt: error: rank 0: after training: SHARDPLAN_TEST_FAIL_AFTER_TRAINING=1 \(a test hook\) \(the 3 trained steps are lost: rerun with --save DIR to keep the model, then --load DIR to go on from it\)$" \
  "${train[@]}" --steps 3
expect_failure saved "^train_gpt: error: rank [01]: after training: .* \(the trained model is saved in $WORK/ckpt at step 3: rerun with --load $WORK/ckpt --steps 3 to go on from it without training again\)$" \
  "${train[@]}" --steps 3 --ranks 2 --plan "$(dirname "$0")/../../plans/gpt.yaml" --save "$WORK/ckpt"
[[ -f $WORK/ckpt/metadata.yaml ]] || fail "no checkpoint in $WORK/ckpt"
run resumed "${train[@]}" --load "$WORK/ckpt" --steps 3 --generate 5 --samples 1 --prompt "From fair"
grep -q "^resumed from $WORK/ckpt at step 3" "$WORK/resumed.log" || fail "resumed: not from step 3"
grep -q "^step " "$WORK/resumed.log" && fail "resumed: trained again"
grep -q "^sample 1: " "$WORK/resumed.log" || fail "resumed: generated nothing"
echo "ok: a failure after training keeps the model, or says how to keep it"
