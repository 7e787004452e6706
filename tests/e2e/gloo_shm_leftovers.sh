#!/usr/bin/env bash
# gloo_shm_leftovers.sh <case> <shardplan> <comm_conformance>
# gloo's shared-memory segments are never left in /dev/shm (plugins/comm_gloo/shm.h).
# Each case runs in a private mount namespace with a small tmpfs on /dev/shm,
# so it sees only its own segments and cannot fill the machine's; exits 77
# (ctest SKIP_RETURN_CODE) where user and mount namespaces are unavailable.
#   full-auto    /dev/shm too small: shm=auto falls back to TCP, nothing left
#   full-on      the same with shm=on: a clear error, nothing left
#   kill-peer    rank 1 killed inside the attach window (two processes, no
#                launcher): rank 0 fails and unlinks the segment itself
#   kill-creator rank 0, which created the segment, killed inside the window
#                under shardplan launch: the launcher removes the job's segment
#   term-launch  SIGTERM to shardplan launch inside the window (Ctrl-C, a
#                batch system's stop): the ranks die without running their
#                destructors, and the launcher removes the job's segment
#   kill9-launch SIGKILL to shardplan launch inside the window: its ranks die
#                with it and the segment stays, until the next launcher
#                removes it (its creator is gone)
#   stale-launch names as killed jobs leave them, and names that must stay
#                (a live creator, another PID namespace, another form): a
#                launcher at start removes exactly the stale ones
#   stale-rank   the same, removed by a rank creating its first segment
#                (ranks started without the launcher, e.g. by srun)
set -uo pipefail
case_name=$1 shardplan=$2 conformance=$3

if [ "${SHARDPLAN_SHM_TEST_INSIDE:-}" != 1 ]; then
  # The probe mounts too: some sandboxes give the namespaces but no mounts in them.
  if ! unshare --user --map-root-user --mount sh -c 'mount -t tmpfs -o size=64k none /dev/shm' 2>/dev/null; then
    echo "SKIP: user and mount namespaces with mounts are unavailable here (unshare --user --map-root-user --mount failed)"
    exit 77
  fi
  size=16m
  case $case_name in full-*) size=64k ;; esac
  export SHARDPLAN_SHM_TEST_INSIDE=1 SHARDPLAN_SHM_TEST_SIZE=$size
  exec unshare --user --map-root-user --mount bash "$0" "$@"
fi

mount -t tmpfs -o "size=$SHARDPLAN_SHM_TEST_SIZE" none /dev/shm || { echo "cannot mount a tmpfs on /dev/shm"; exit 1; }
unset SHARDPLAN_GLOO_SHM SHARDPLAN_JOB_ID
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*"; exit 1; }
shm_empty() {
  local left
  left=$(ls -A /dev/shm)
  [ -z "$left" ] || fail "left in /dev/shm: $left"
}
# Waits until every one of $1 ranks has announced the pause in $2.
wait_for_pause() {
  for _ in $(seq 300); do
    [ "$(grep -c 'gloo shm test pause' "$2" 2>/dev/null)" -ge "$1" ] && return 0
    sleep 0.1
  done
  cat "$2"
  fail "the ranks never reached the attach window"
}

# Two ranks under shardplan launch, both paused inside the attach window
# with the segment in /dev/shm; $launcher is the launcher's pid.
launch_into_window() {
  export SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS=5000
  "$shardplan" launch -n 2 --backend gloo --timeout-ms 20000 -- "$conformance" --quick --option shm=on \
    >"$work/out" 2>&1 &
  launcher=$!
  wait_for_pause 2 "$work/out"
  [ -n "$(ls -A /dev/shm)" ] || fail "no segment inside the attach window"
}

# plant_names: a name in each form stale_* below checks; $live and $dead
# are a running and an ended process.
plant_names() {
  local ns start_live start_dead
  ns=$(stat -Lc %i /proc/self/ns/pid)
  start_of() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $20}'; }
  sleep 300 &
  live=$!
  sleep 300 &
  dead=$!
  start_live=$(start_of $live) start_dead=$(start_of $dead)
  kill $dead
  wait $dead 2>/dev/null
  for n in "gone-$dead-$start_dead-$ns-0-0000abcd" "reused-$live-$((start_live + 1))-$ns-3-0000abcd" \
    "live-$live-$start_live-$ns-0-0000abcd" "otherns-$dead-$start_dead-$((ns + 1))-0-0000abcd" \
    "oldform-$dead-0-0000abcd"; do
    head -c 4096 /dev/zero >"/dev/shm/shardplan-gloo-$n"
  done
  : >/dev/shm/not-ours
}
# stale_removed LOG WHO: the two stale names are gone, the others stay, and
# LOG says so.
stale_removed() {
  local left
  kill $live
  left=$(ls /dev/shm | sed "s/-$live-/-LIVE-/; s/-$dead-/-DEAD-/" | sed 's/-[0-9]*-[0-9]*-0-0000abcd$//' | sort | tr '\n' ' ')
  [ "$left" = "not-ours shardplan-gloo-live-LIVE shardplan-gloo-oldform-DEAD-0-0000abcd shardplan-gloo-otherns-DEAD " ] ||
    { ls -l /dev/shm; cat "$1"; fail "left in /dev/shm: $left"; }
  grep -q "$2 2 shared-memory segment(s) from /dev/shm" "$1" || { cat "$1"; fail "no line saying 2 were removed"; }
}

case $case_name in
full-auto)
  "$conformance" --backend gloo --threads 2 --quick >"$work/out" 2>&1 || { cat "$work/out"; fail "shm=auto did not fall back to TCP"; }
  shm_empty
  echo "PASS: shm=auto fell back to TCP and left nothing"
  ;;
full-on)
  "$conformance" --backend gloo --threads 2 --quick --option shm=on >"$work/out" 2>&1 && fail "shm=on succeeded on a full /dev/shm"
  grep -q "shm=on, but shared memory cannot be used: cannot create /shardplan-gloo-.*No space left on device" "$work/out" ||
    { cat "$work/out"; fail "no clear error"; }
  shm_empty
  echo "PASS: shm=on refused clearly and left nothing"
  ;;
kill-peer)
  export SHARDPLAN_STORE="file://$work/store" SHARDPLAN_BACKEND=gloo WORLD_SIZE=2 SHARDPLAN_TIMEOUT_MS=20000
  export SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS=3000
  RANK=0 "$conformance" --quick --option shm=on >"$work/r0" 2>&1 &
  r0=$!
  RANK=1 "$conformance" --quick --option shm=on >"$work/r1" 2>&1 &
  r1=$!
  wait_for_pause 1 "$work/r1"
  kill -KILL $r1
  wait $r0 && fail "rank 0 succeeded without its peer"
  shm_empty
  echo "PASS: rank 0 unlinked the segment when its peer died inside the attach window"
  ;;
kill-creator)
  launch_into_window
  pid0=$(sed -n 's/.*gloo shm test pause: rank 0 pid \([0-9]*\) .*/\1/p' "$work/out" | head -1)
  [ -n "$pid0" ] || fail "no pid for rank 0"
  kill -KILL "$pid0"
  wait $launcher && fail "the launcher reported success"
  grep -q "removed 1 shared-memory segment(s) of this job" "$work/out" || { cat "$work/out"; fail "the launcher did not say it removed the segment"; }
  shm_empty
  echo "PASS: the launcher removed the segment of a rank killed inside the attach window"
  ;;
term-launch)
  launch_into_window
  kill -TERM $launcher
  wait $launcher
  status=$?
  [ $status -eq 143 ] || { cat "$work/out"; fail "the launcher exited with $status, expected 143 (SIGTERM)"; }
  shm_empty
  echo "PASS: the launcher removed the segment when it was stopped inside the attach window"
  ;;
kill9-launch)
  launch_into_window
  pids=$(sed -n 's/.*gloo shm test pause: rank [01] pid \([0-9]*\) .*/\1/p' "$work/out")
  kill -KILL $launcher
  wait $launcher 2>/dev/null
  for p in $pids; do
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$p" 2>/dev/null && fail "rank pid $p outlived its launcher"
  done
  [ -n "$(ls -A /dev/shm)" ] || fail "nothing left in /dev/shm: the case does not reproduce the leftover"
  "$shardplan" launch -n 1 -- true >"$work/next" 2>&1 || { cat "$work/next"; fail "the next launcher failed"; }
  grep -q "removed 1 shared-memory segment(s) from /dev/shm (shardplan-gloo-\*) whose process is gone" "$work/next" ||
    { cat "$work/next"; fail "the next launcher did not say it removed the segment"; }
  shm_empty
  echo "PASS: the next launcher removed the segment a launcher killed with SIGKILL left"
  ;;
stale-launch)
  plant_names
  "$shardplan" launch -n 1 -- true >"$work/out" 2>&1 || { cat "$work/out"; fail "the launcher failed"; }
  stale_removed "$work/out" "shardplan launch: removed"
  echo "PASS: the launcher removed exactly the stale names"
  ;;
stale-rank)
  plant_names
  "$conformance" --backend gloo --threads 2 --quick --option shm=on >"$work/out" 2>&1 ||
    { cat "$work/out"; fail "the conformance run failed"; }
  stale_removed "$work/out" "gloo: removed"
  echo "PASS: a rank creating its first segment removed exactly the stale names"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
