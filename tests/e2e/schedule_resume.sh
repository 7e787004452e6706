#!/usr/bin/env bash
# schedule_resume.sh TRAIN_GPT PLANS_DIR
# The trainers' lr schedule (--warmup, --lr-min; examples/models/schedule.h)
# through checkpoints: {data: 2, model: 2} with ZeRO-1, --micro-batches 2 and
# --clip (small enough to clip every step), 4 thread ranks, float64. An
# uninterrupted run saves every 2 steps; resumed from its step-2 checkpoint
# (mid-warmup, --load) and from its step-6 one (mid-decay, --resume auto),
# every later step prints the uninterrupted run's loss (1e-12 relative),
# gradient norm and lr; resumed in one process, its lrs; in bfloat16 with
# float32 masters and a loss scaler, the same step lines. A resume with another --steps is one
# error line naming both schedules, and with --override-schedule goes on
# with the new decay from the saved position.
set -u
TRAIN=$1 PLANS=$2
source "$(dirname "$0")/ckpt_common.sh" schedule-resume
sed 's/^data_parallel: {bucket_mb: 25}$/data_parallel: {bucket_mb: 0.02, zero: true}/' "$PLANS/gpt_2d.yaml" >"$WORK/zero.yaml"
grep -q 'zero: true' "$WORK/zero.yaml" || fail "plans/gpt_2d.yaml changed: no data_parallel line to edit"
base=("$TRAIN" --config context=16,embed=32,mlp=64,layers=1 --dtype float64 --batch 8 --log-every 1 --ranks 4
  --plan "$WORK/zero.yaml" --micro-batches 2 --clip 0.5)
train=("${base[@]}" --lr 1e-2 --warmup 3 --lr-min 1e-3)
# "STEP LOSS NORM LR" for every step line.
steps() {
  awk '$1 == "step" && $3 == "loss" {
    norm = "-"; lr = "-"
    for (i = 4; i < NF; i++) { if ($i == "norm") norm = $(i + 1); if ($i == "lr") lr = $(i + 1) }
    print $2, $4, norm, lr }' "$1"
}
# Every step from FIRST to 10 of LOG has the reference's loss and norm
# (1e-12 relative) and lr.
same_steps() {
  local log=$1 first=$2 n
  n=$(join <(steps "$WORK/reference.log" | sort -k1,1) <(steps "$WORK/$log.log" | sort -k1,1) | awk -v first="$first" '
    function off(x, y) { d = x - y; if (d < 0) d = -d; s = x < 0 ? -x : x; return d > 1e-12 * s }
    { if (off($2, $5) || off($3, $6) || $4 != $7) { print "step " $1 ": " $2 " " $3 " " $4 " vs " $5 " " $6 " " $7 > "/dev/stderr"; bad = 1 }
      if ($1 < first) { print "step " $1 " printed before the resume point" > "/dev/stderr"; bad = 1 }
      n++ }
    END { print n; exit bad }') || fail "$log: the resumed steps differ from the uninterrupted run's"
  [[ $n -eq $((11 - first)) ]] || fail "$log: compared $n steps, expected $((11 - first))"
}

run reference "${train[@]}" --steps 10 --save "$WORK/ref" --save-every 2 --keep 5
[[ $(steps "$WORK/reference.log" | awk '$3 > 0.5 && $4 != "-"' | wc -l) -eq 10 ]] ||
  fail "the reference did not print 10 steps, each clipped (norm above --clip 0.5) and with its lr"
# Warmup 1e-2 * k / 3 for k = 1..3, then the cosine down to 1e-3 at step 10.
[[ $(steps "$WORK/reference.log" | awk '{ printf "%s ", $4 }') == \
  "3.333e-03 6.667e-03 1.000e-02 9.554e-03 8.306e-03 6.501e-03 4.499e-03 2.694e-03 1.446e-03 1.000e-03 " ]] ||
  fail "the lrs printed are not the schedule's: $(steps "$WORK/reference.log" | awk '{ printf "%s ", $4 }')"

run mid_warmup "${train[@]}" --steps 10 --load "$WORK/ref.step-2"
grep -qE "^resumed from [^ ]*/ref\.step-2 at step 2$" "$WORK/mid_warmup.log" || fail "did not resume at step 2"
same_steps mid_warmup 3
cp -r "$WORK/ref.step-6" "$WORK/auto"
run mid_decay "${train[@]}" --steps 10 --save "$WORK/auto" --resume auto
grep -qE "^resumed from [^ ]*/auto at step 6$" "$WORK/mid_decay.log" || fail "--resume auto did not resume at step 6"
same_steps mid_decay 7
echo "ok: resumed mid-warmup (step 2) and mid-decay (step 6), the uninterrupted run's losses and lrs"
# bfloat16 with float32 masters and a loss scaler: the masters, the scaler's
# state and the schedule's position all resume (every printed field but the
# throughput the uninterrupted run's, as text).
bf16=("${train[@]/float64/bfloat16}" --loss-scale dynamic --steps 8)
fields() { sed -E 's/  tokens\/s [0-9]+//' "$WORK/$1.log" | grep -E '^step +[5-8] '; }
run bf16_reference "${bf16[@]}" --save "$WORK/bf16" --save-every 4
run bf16_resumed "${bf16[@]}" --load "$WORK/bf16.step-4"
grep -q ' scale 65536 ' "$WORK/bf16_resumed.log" || fail "bfloat16: no loss scale printed"
[[ $(fields bf16_resumed | wc -l) -eq 4 ]] && diff <(fields bf16_reference) <(fields bf16_resumed) >"$WORK/bf16_diff.log" ||
  fail "bfloat16: the resumed steps 5 to 8 differ: $(head -4 "$WORK/bf16_diff.log")"
echo "ok: bfloat16 with masters and a loss scaler resumes mid-decay with the same steps"
# At another plan and number of ranks (one process, unsharded): the same lrs.
run unsharded "$TRAIN" --config context=16,embed=32,mlp=64,layers=1 --dtype float64 --batch 8 --log-every 1 \
  --lr 1e-2 --warmup 3 --lr-min 1e-3 --steps 10 --load "$WORK/ref.step-6"
[[ $(steps "$WORK/unsharded.log" | awk '{ printf "%s ", $4 }') == "4.499e-03 2.694e-03 1.446e-03 1.000e-03 " ]] ||
  fail "resumed unsharded, the lrs of steps 7 to 10 are not the schedule's"

"${train[@]}" --steps 14 --load "$WORK/ref.step-6" >"$WORK/other.log" 2>&1 && fail "resumed with another --steps"
grep -qE "error: (rank [0-9]+: )?checkpoint '[^']*ref\.step-6' was trained with --warmup 3 --lr 0\.01 --lr-min 0\.001 --steps 10, this run asks for --warmup 3 --lr 0\.01 --lr-min 0\.001 --steps 14: .*--override-schedule to go on with these from its position 6$" \
  "$WORK/other.log" || fail "the error does not name both schedules"
[[ $(grep -c 'error' "$WORK/other.log") -eq 1 ]] || fail "not exactly one error line"
grep -q '^step ' "$WORK/other.log" && fail "trained with another schedule"
run override "${train[@]}" --steps 14 --load "$WORK/ref.step-6" --override-schedule
# Step 7 of a cosine from step 3 to 14: 1e-3 + 9e-3 * (1 + cos(pi * 4 / 11)) / 2.
[[ $(steps "$WORK/override.log" | awk '$1 == 7 { print $4 }') == 7.369e-03 ]] ||
  fail "--override-schedule: step 7's lr is not the new decay's from position 6"
[[ $(steps "$WORK/override.log" | wc -l) -eq 8 ]] || fail "--override-schedule did not train steps 7 to 14"
echo "ok: another --steps is refused, and goes on with the new decay under --override-schedule"
# A --load that trains no step uses no lr: the schedule is not compared.
run no_step "${base[@]}" --steps 10 --load "$WORK/ref"
grep -q '^step ' "$WORK/no_step.log" && fail "--load at the last step trained"
echo "ok: a load that trains no step needs no schedule settings"
