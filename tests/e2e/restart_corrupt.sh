#!/usr/bin/env bash
# restart_corrupt.sh SHARDPLAN TRAIN_MODEL PLAN
# `shardplan launch --max-restarts 1` with `--save-every 2 --resume auto`
# (issue 33, item 7): once a few checkpoints are saved both ranks are
# stopped, the newest checkpoint's rank-0 file is damaged (one byte changed),
# and rank 1 is killed. The restarted ranks skip the damaged checkpoint (one
# line naming it), go on from the one before it, and end with exactly the
# losses of an uninterrupted run. Before --keep, every restart failed on the
# same damaged checkpoint and the run was lost.
set -u
SP=$1 TRAIN=$2 PLAN=$3
source "$(dirname "$0")/ckpt_common.sh" restart-corrupt
LPID=
trap '[[ -n $LPID ]] && kill -KILL "$LPID" 2>/dev/null; rm -rf "$WORK"' EXIT
unset GROUP_RANK GROUP_WORLD_SIZE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TIMEOUT_MS
train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --steps 40 --save-every 2 --plan "$PLAN")
launch() { timeout -k 5 120 "$SP" launch -n 2 --backend gloo --timeout-ms 10000 "$@"; }

launch -- "${train[@]}" --save "$WORK/reference" >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
launch --max-restarts 1 -- "${train[@]}" --save "$WORK/run" --resume auto >"$WORK/run.log" 2>"$WORK/run_err.log" &
LPID=$!
for ((i = 0; i < 600; i++)); do
  grep -qE "^\[rank 0\] saved .* at step 4$" "$WORK/run.log" && break
  kill -0 "$LPID" 2>/dev/null || fail "the job ended before step 4 was saved"
  sleep 0.05
done
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
declare -A rank_pid
for pid in $(descendants "$LPID"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(basename "$TRAIN" | cut -c1-15)" ]] || continue
  r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^RANK=//p')
  [[ -n $r ]] && rank_pid[$r]=$pid
done
[[ -n ${rank_pid[0]:-} && -n ${rank_pid[1]:-} ]] || fail "ranks 0 and 1 not found among the launcher's children"
# Both ranks stopped inside a save (a *.partial beside the checkpoint) would
# finish it after the damage and replace the damaged checkpoint with a good
# one: then let them go on a moment and stop them again.
for ((i = 0; ; i++)); do
  kill -STOP "${rank_pid[0]}" "${rank_pid[1]}"
  sleep 0.2
  compgen -G "$WORK/run*.partial" >/dev/null || break
  ((i < 100)) || fail "the ranks were inside a save each of 100 times they were stopped"
  kill -CONT "${rank_pid[0]}" "${rank_pid[1]}"
  sleep 0.01
done
# Whatever the newest is now; written as a new file (not in place), so a
# kept copy that still shares its inode (a save stopped midway) stays intact.
f=$WORK/run/rank-00000.bin
[[ -f $f ]] || fail "no checkpoint in $WORK/run"
{ head -c 100 "$f"; printf '\377'; tail -c +102 "$f"; } >"$f.new"
cmp -s "$f" "$f.new" && { { head -c 100 "$f"; printf '\001'; tail -c +102 "$f"; } >"$f.new"; }
mv "$f.new" "$f"
kill -KILL "${rank_pid[1]}"
kill -CONT "${rank_pid[0]}"
wait "$LPID"
rc=$?
LPID=
((rc == 0)) || fail "the restarted job exited with $rc"
grep -q "shardplan launch: restart 1 of 1 after: rank 1 (pid ${rank_pid[1]}) was killed by signal 9 (SIGKILL)" \
  "$WORK/run_err.log" || fail "the launcher did not restart after rank 1's SIGKILL"
grep -qE "^\[rank 0\] warning: --resume auto skipped checkpoint '[^']*/run': .*rank-00000\.bin' is corrupted" \
  "$WORK/run.log" || fail "the restart did not name the damaged checkpoint"
resumed=$(sed -nE 's/^\[rank 0\] resumed from [^ ]*\/run\.step-([0-9]+) at step [0-9]+$/\1/p' "$WORK/run.log")
[[ -n $resumed ]] || fail "the restart did not resume from a kept checkpoint"
echo "damaged the newest checkpoint, killed rank 1; resumed from run.step-$resumed"
# Every (step, loss) printed, including the steps run twice, is the reference's.
losses "$WORK/reference.log" | sort -n >"$WORK/ref.txt"
[[ $(wc -l <"$WORK/ref.txt") -eq 40 ]] || fail "the reference printed $(wc -l <"$WORK/ref.txt") steps, not 40"
losses "$WORK/run.log" | sort -n -u >"$WORK/run.txt"
diff "$WORK/ref.txt" "$WORK/run.txt" >"$WORK/diff.log" || fail "losses differ: $(head -5 "$WORK/diff.log")"
echo "40 losses equal to the uninterrupted run's"
