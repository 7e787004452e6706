#!/usr/bin/env bash
# ckpt_keep.sh TRAIN_MODEL PLAN
# --save-every with --keep (issue 33, item 7), 2 thread ranks, float64:
# --keep 2 leaves exactly DIR and DIR.step-N; a newest checkpoint with a
# flipped byte, then one with a truncated data file, is skipped with one line
# naming it and why, and --resume auto goes on from the one before it with
# the losses of an uninterrupted run; when every checkpoint is damaged the
# run stops with one line naming each; --keep 1 keeps DIR alone.
set -u
TRAIN=$1 PLAN=$2
source "$(dirname "$0")/ckpt_common.sh" ckpt-keep
train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --ranks 2 --plan "$PLAN" --save-every 2)
# The checkpoint directories beside $WORK/run, by name.
family() { (cd "$WORK" && ls -d run run.* 2>/dev/null | tr '\n' ' '); }

run reference "${train[@]}" --steps 14 --save "$WORK/reference"
run first "${train[@]}" --steps 8 --save "$WORK/run"
[[ $(family) == "run run.step-6 " ]] || fail "--keep 2 (the default) left: $(family)"

# A flipped byte in the newest checkpoint's rank-0 data file.
f=$WORK/run/rank-00000.bin
byte=$(od -An -tu1 -j100 -N1 "$f" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$f" bs=1 seek=100 conv=notrunc status=none
run flipped "${train[@]}" --steps 12 --save "$WORK/run" --resume auto
skipped=$(grep -c 'skipped checkpoint' "$WORK/flipped.log")
[[ $skipped -eq 1 ]] || fail "expected one 'skipped checkpoint' line, got $skipped"
grep -qE "^warning: --resume auto skipped checkpoint '[^']*/run': .*rank-00000\.bin' is corrupted: checksum" \
  "$WORK/flipped.log" || fail "the skipped line does not name the corrupted file"
grep -qE "^resumed from [^ ]*/run\.step-6 at step 6$" "$WORK/flipped.log" || fail "did not resume from run.step-6"
same_losses "$WORK/reference.log" "$WORK/flipped.log" 6
[[ $(family) == "run run.step-10 " ]] || fail "after resuming from step 6 and saving 8, 10, 12: $(family)"
echo "a flipped byte: skipped, resumed at step 6, 6 losses equal to the uninterrupted run's"

# A truncated data file of the newest (rank 1's).
truncate -s 10 "$WORK/run/rank-00001.bin"
run truncated "${train[@]}" --steps 14 --save "$WORK/run" --resume auto
grep -qE "^warning: --resume auto skipped checkpoint '[^']*/run': .*rank-00001\.bin' is truncated" \
  "$WORK/truncated.log" || fail "the skipped line does not name the truncated file"
grep -qE "^resumed from [^ ]*/run\.step-10 at step 10$" "$WORK/truncated.log" || fail "did not resume from run.step-10"
same_losses "$WORK/reference.log" "$WORK/truncated.log" 4
echo "a truncated file: skipped, resumed at step 10, 4 losses equal to the uninterrupted run's"

# Every checkpoint damaged: no silent start from scratch.
rm "$WORK/run/metadata.yaml"
truncate -s 10 "$WORK/run.step-12/rank-00000.bin"
"${train[@]}" --steps 16 --save "$WORK/run" --resume auto >"$WORK/none.log" 2>&1 && fail "resumed from damaged checkpoints"
grep -qE "^train_model: error: (rank [0-9]+: )?--resume auto: none of the 2 checkpoint\(s\) of --save [^ ]*/run loads: .*metadata\.yaml' is missing.*; .*run\.step-12/rank-00000\.bin' is truncated" \
  "$WORK/none.log" || fail "the error does not name both checkpoints"
[[ $(grep -c 'error' "$WORK/none.log") -eq 1 ]] || fail "not exactly one error line"
grep -q '^step ' "$WORK/none.log" && fail "trained although no checkpoint loads"
echo "every checkpoint damaged: one error naming both"

rm -rf "$WORK"/run "$WORK"/run.*
run keep1 "${train[@]}" --steps 6 --save "$WORK/run" --keep 1
[[ $(family) == "run " ]] || fail "--keep 1 left: $(family)"
run keep3 "${train[@]}" --steps 10 --save "$WORK/run" --keep 3 --resume auto
[[ $(family) == "run run.step-6 run.step-8 " ]] || fail "--keep 3 left: $(family)"
echo "--keep 1 and 3 keep 1 and 3"
