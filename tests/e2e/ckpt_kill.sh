#!/usr/bin/env bash
# ckpt_kill.sh SHARDPLAN TRAIN_MODEL PLAN
# A rank killed with SIGKILL in the middle of a checkpoint save (two gloo
# processes through `shardplan launch`): the launcher reports the dead rank
# and stops, nothing hangs, the previous checkpoint is left byte for byte as
# it was, and resuming from it (at 2 ranks and unsharded) gives the losses of
# an uninterrupted run. The kill lands in a deterministic window: with
# SHARDPLAN_TEST_CKPT_PAUSE_MS every rank announces itself and sleeps between
# writing its pieces and the publication of the new checkpoint.
set -u
SP=$1
TRAIN=$2
PLAN=$3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-kill.XXXXXX")
LPID=
cleanup() {
  [[ -n $LPID ]] && kill -KILL "$LPID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do
    echo "--- $(basename "$f") (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR MASTER_PORT \
  SHARDPLAN_BACKEND SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TEST_CKPT_PAUSE_MS

train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5)
launch() { timeout -k 5 120 "$SP" launch -n 2 --backend gloo -- "${train[@]}" --plan "$PLAN" "$@"; }
losses() { sed -E 's/^\[rank [0-9]+\] //' "$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4}'; }
# same_losses REF GOT: every step GOT printed has REF's loss (relative 1e-7, the printed precision).
same_losses() {
  local n
  n=$(join <(losses "$1") <(losses "$2") | awk '
    { d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > 1e-7 * s) { print "step " $1 ": " $2 " vs " $3 > "/dev/stderr"; bad = 1 } n++ }
    END { print n; exit bad }') || fail "$2: losses differ from the uninterrupted run"
  [[ $n -eq $3 ]] || fail "$2: compared $n steps, expected $3"
}

"${train[@]}" --steps 6 >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
launch --steps 3 --save "$WORK/ckpt" >"$WORK/first_save.log" 2>&1 || fail "the first save failed"
grep -q 'saved .* at step 3' "$WORK/first_save.log" || fail "no 'saved ... at step 3'"
cp -a "$WORK/ckpt" "$WORK/before"

# Resume and save after every step; rank 1 dies inside the first of those saves.
SHARDPLAN_TEST_CKPT_PAUSE_MS=60000 launch --load "$WORK/ckpt" --steps 6 --save "$WORK/ckpt" --save-every 1 \
  >"$WORK/killed.log" 2>"$WORK/killed_err.log" &
LPID=$!
start=$(date +%s)
pid=
while [[ -z $pid ]]; do
  pid=$(sed -n 's/^\[rank 1\] checkpoint test pause: rank 1 pid \([0-9]*\) .*/\1/p' "$WORK/killed_err.log")
  (($(date +%s) - start < 60)) || fail "rank 1 never reached the checkpoint pause"
  kill -0 "$LPID" 2>/dev/null || [[ -n $pid ]] || fail "the launcher ended before the pause"
  sleep 0.1
done
kill -KILL "$pid"
wait "$LPID"
rc=$?
LPID=
elapsed=$(($(date +%s) - start))
[[ $rc -ne 124 && $rc -ne 137 ]] || fail "the launcher hung (killed by timeout)"
[[ $rc -ne 0 ]] || fail "the launcher exited 0 after a rank was killed"
((elapsed < 50)) || fail "the launcher took ${elapsed} s to stop after the kill"
grep -q "^shardplan launch: rank 1 (pid $pid) was killed by signal 9 (SIGKILL)" "$WORK/killed_err.log" ||
  fail "the launcher did not report rank 1 killed by SIGKILL"
grep -q 'saved .* at step 4' "$WORK/killed.log" && fail "the interrupted save claims to have finished"

# The previous checkpoint, untouched; the half-written one never replaced it.
diff -r "$WORK/before" "$WORK/ckpt" >"$WORK/diff.log" 2>&1 || fail "the previous checkpoint changed: $(cat "$WORK/diff.log")"
launch --load "$WORK/ckpt" --steps 6 >"$WORK/resumed2.log" 2>&1 || fail "resuming at 2 ranks failed"
grep -q 'resumed from .* at step 3' "$WORK/resumed2.log" || fail "did not resume at step 3"
same_losses "$WORK/reference.log" "$WORK/resumed2.log" 3
"${train[@]}" --load "$WORK/ckpt" --steps 6 >"$WORK/resumed1.log" 2>&1 || fail "resuming unsharded failed"
same_losses "$WORK/reference.log" "$WORK/resumed1.log" 3
echo "ok: rank 1 killed after ${elapsed} s in the save, previous checkpoint intact, losses of steps 4-6 match"
