#!/usr/bin/env bash
# restart_kill.sh SHARDPLAN TRAIN_MODEL PLAN
# `shardplan launch --max-restarts 1` with `--save-every 2 --resume auto`:
# rank 1 is killed with SIGKILL at a random step; the launcher restarts both
# ranks, they resume from the last checkpoint, and the job ends with exactly
# the losses (every step printed, before and after the kill) and the
# parameters (the final checkpoint, byte for byte as safetensors) of an
# uninterrupted run at the same 2 ranks, float64.
set -u
SP=$1 TRAIN=$2 PLAN=$3
source "$(dirname "$0")/ckpt_common.sh" restart-kill
LPID=
trap '[[ -n $LPID ]] && kill -KILL "$LPID" 2>/dev/null; rm -rf "$WORK"' EXIT
unset GROUP_RANK GROUP_WORLD_SIZE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TIMEOUT_MS
train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --steps 12 --save-every 2 --plan "$PLAN")
launch() { timeout -k 5 120 "$SP" launch -n 2 --backend gloo --timeout-ms 10000 "$@"; }

launch -- "${train[@]}" --save "$WORK/reference" >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
kill_at=$((3 + RANDOM % 5))
launch --max-restarts 1 -- "${train[@]}" --save "$WORK/run" --resume auto >"$WORK/run.log" 2>"$WORK/run_err.log" &
LPID=$!
for ((i = 0; i < 600; i++)); do
  grep -qE "^\[rank 0\] step +$kill_at " "$WORK/run.log" && break
  kill -0 "$LPID" 2>/dev/null || fail "the job ended before step $kill_at"
  sleep 0.05
done
# The job runs under a subshell and `timeout`: rank 1 is a descendant of $LPID.
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
victim=
for pid in $(descendants "$LPID"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(basename "$TRAIN" | cut -c1-15)" ]] || continue
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1' && victim=$pid
done
[[ -n $victim ]] || fail "rank 1 not found among the launcher's children"
kill -KILL "$victim"
wait "$LPID"
rc=$?
LPID=
((rc == 0)) || fail "the restarted job exited with $rc"
grep -qx "shardplan launch: restart 1 of 1 after: rank 1 (pid $victim) was killed by signal 9 (SIGKILL)" "$WORK/run_err.log" ||
  fail "the launcher did not restart after rank 1's SIGKILL"
grep -qE '^\[rank 0\] resumed from .* at step [0-9]+' "$WORK/run.log" || fail "the restarted ranks did not resume"
resumed=$(sed -nE 's/^\[rank 0\] resumed from .* at step ([0-9]+).*/\1/p' "$WORK/run.log")
echo "killed rank 1 once step $kill_at was printed; resumed at step $resumed"

# Every (step, loss) printed, including the steps run twice, is the reference's.
losses "$WORK/reference.log" | sort -n >"$WORK/ref.txt"
[[ $(wc -l <"$WORK/ref.txt") -eq 12 ]] || fail "the reference printed $(wc -l <"$WORK/ref.txt") steps, not 12"
[[ $(losses "$WORK/run.log" | sort -n -u | cut -d' ' -f1 | uniq | wc -l) -eq 12 ]] || fail "the run did not print steps 1 to 12"
losses "$WORK/run.log" | sort -n -u | diff "$WORK/ref.txt" - >"$WORK/diff.log" || fail "losses differ: $(head -5 "$WORK/diff.log")"
"$SP" ckpt convert "$WORK/reference" --to safetensors "$WORK/reference.safetensors" >/dev/null || fail "convert reference"
"$SP" ckpt convert "$WORK/run" --to safetensors "$WORK/run.safetensors" >/dev/null || fail "convert run"
cmp -s "$WORK/reference.safetensors" "$WORK/run.safetensors" || fail "the final parameters differ from the uninterrupted run's"
echo "12 losses and the final parameters equal to the uninterrupted run's"
