#!/usr/bin/env bash
# Link faults between two test hosts (tests/hosts/netns.sh), 2 ranks each, the
# GPT on plans/gpt.yaml in float64 over gloo:
#   link_faults.sh CASE SHARDPLAN TRAIN_MODEL SOURCE_DIR
# link_down:   host 1's cable is cut while training: both launchers exit 1
#              within the timeout (+ the launcher's 5 s grace) naming their
#              node and rank, the ranks name the collective and the timeout,
#              no process is left on either host, and the last checkpoint
#              (--save-every) is whole: `shardplan ckpt inspect` reads it and
#              one process resumes from it.
# link_flap:   the cable is out for a third of the timeout, then back: the
#              job either ends with the uninterrupted run's losses or fails
#              as in link_down; never hangs, never other numbers.
# master_gone: host 0's cable is cut while its rank 0 waits for node 1 at the
#              rendezvous (its store listening on host 0's address only):
#              node 1 fails within the timeout naming tcp://<host 0>:29500,
#              node 0 naming the key it waited for.
# restart_across: both launchers with --max-restarts 1 and the examples'
#              --save-every 2 --resume auto; rank 3 (host 1) is killed with
#              SIGKILL: node 1 restarts it, node 0's ranks lose their peer and
#              restart too, the new rank 0 serves a new store, every rank
#              resumes from the last checkpoint, and the losses are one
#              process's (float64, to the printed precision).
# restart_together: --max-restarts with ranks that do not talk (a shell that
#              sleeps): rank 3 fails on host 1, so only the launchers' store
#              can tell node 0, which must stop its sleeping ranks and restart
#              with node 1 in a new rendezvous round (the ranks' store path
#              carries it); then the restart limit reached on both nodes
#              together; then a launcher stopped by SIGTERM ends the other;
#              then node 0 alone fails within the timeout naming node 1.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns.sh"
hosts_require
CASE=$1 SP=$2 TRAIN=$3 SRC=$4
TIMEOUT_MS=3000
WORK=$(mktemp -d "${TMPDIR:-/tmp}/link-faults.XXXXXX")
cleanup() { hosts_down; rm -rf "$WORK"; }
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do [[ -e $f ]] && { echo "--- $(basename "$f") (last 15 lines)" >&2; tail -n 15 "$f" >&2; }; done
  exit 1
}
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR MASTER_PORT \
  SHARDPLAN_BACKEND SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TIMEOUT_MS
train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5)
hosts_up 2 || fail "cannot make the test hosts"
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
now_ms() { date +%s%3N; }

# start_node K ARGS...: node K's launcher on host K (the `timeout` only
# catches a hang: status 124 or 137), with the options in LAUNCH_OPTS; its
# pid in PID[K], output in nodeK.log.
PID=()
LAUNCH_OPTS=()
start_node() {
  local k=$1
  shift
  timeout -k 5 90 ip netns exec "$(hosts_ns "$k")" "$SP" launch -n 2 --nnodes 2 --node-rank "$k" \
    --master-addr "$(host_addr 0)" --master-port 29500 --local-addr "$(host_addr "$k")" --timeout-ms "$TIMEOUT_MS" \
    ${LAUNCH_OPTS[@]+"${LAUNCH_OPTS[@]}"} -- "${train[@]}" --plan "$SRC/plans/gpt.yaml" "$@" >"$WORK/node$k.log" 2>&1 &
  PID[k]=$!
}
wait_for_line() {  # wait_for_line FILE REGEX
  local i
  for ((i = 0; i < 600; i++)); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "no line matching '$2' in $(basename "$1") within 60 s"
}
# expect_node_failed K SINCE_MS: node K's launcher exited 1 within the bound.
expect_node_failed() {
  local k=$1 since=$2 rc elapsed
  wait "${PID[k]}"
  rc=$?
  elapsed=$(($(now_ms) - since))
  ((rc != 124 && rc != 137)) || fail "node $k's launcher hung (stopped by timeout)"
  ((rc == 1)) || fail "node $k's launcher exited with $rc, expected 1"
  ((elapsed <= TIMEOUT_MS + 7000)) || fail "node $k took $elapsed ms to fail (timeout $TIMEOUT_MS ms)"
  echo "node $k failed after $elapsed ms"
}
expect_no_leftovers() {
  local k
  for k in 0 1; do [[ -z $(host_pids "$k") ]] || fail "processes left on host $k: $(host_pids "$k" | xargs)"; done
}
# The ranks' and launcher's lines after a lost link, on node K: a rank names
# the other host, either as the group's ranks there (a timeout) or as the peer
# that closed or reset its connection. A cut that lands in a step's replica
# check (every 10 steps) is reported with the step's "step N: " before it.
expect_link_errors() {
  local k=$1 log=$WORK/node$1.log other
  other=$(host_addr $((1 - k)) | sed 's/\./\\./g')
  grep -qE "^\[rank [0-9]+\] train_model: error: (step [0-9]+: )?gloo [a-z_]+ on group 'model' \(rank [0-9] of 4\): .*(the group's ranks on other hosts: $other \([0-9, ]+\).*within $TIMEOUT_MS ms|(closed|reset).*\[$other\])" "$log" ||
    fail "no rank on node $k named the collective and the host it lost"
  grep -qE "^shardplan launch: node $k of 2 \($(host_addr "$k")\): rank [0-9]+ \(pid [0-9]+\) exited with status 1" "$log" ||
    fail "node $k's launcher did not name its node and the failed rank"
}
losses() { sed -E 's/^\[rank [0-9]+\] //' "$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4}' | sort -n -u; }

case_link_down() {
  start_node 0 --steps 100000 --save "$WORK/ckpt" --save-every 4
  start_node 1 --steps 100000 --save "$WORK/ckpt" --save-every 4
  wait_for_line "$WORK/node0.log" '^\[rank 0\] saved .* at step 8$'
  local cut
  cut=$(now_ms)
  link_down 1
  expect_node_failed 0 "$cut"
  expect_node_failed 1 "$cut"
  expect_no_leftovers
  expect_link_errors 0
  expect_link_errors 1
  "$SP" ckpt inspect "$WORK/ckpt" >"$WORK/inspect.log" 2>&1 || fail "ckpt inspect cannot read the last checkpoint"
  local step
  step=$(sed -n 's/^attribute step: \([0-9]*\)$/\1/p' "$WORK/inspect.log")
  [[ -n $step && $step -ge 8 && $((step % 4)) -eq 0 ]] || fail "the checkpoint's step is '$step', expected 8, 12, ..."
  "${train[@]}" --load "$WORK/ckpt" --steps $((step + 1)) >"$WORK/resume.log" 2>&1 || fail "resuming from step $step failed"
  grep -q "resumed from .* at step $step" "$WORK/resume.log" || fail "did not resume at step $step"
  echo "checkpoint at step $step intact"
}

case_link_flap() {
  TIMEOUT_MS=6000
  "${train[@]}" --steps 40 >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
  start_node 0 --steps 40
  start_node 1 --steps 40
  wait_for_line "$WORK/node0.log" '^\[rank 0\] step +5 '
  local cut rc0 rc1
  cut=$(now_ms)
  link_down 1
  sleep 2
  link_up 1
  wait "${PID[0]}"; rc0=$?
  wait "${PID[1]}"; rc1=$?
  ((rc0 != 124 && rc0 != 137 && rc1 != 124 && rc1 != 137)) || fail "a launcher hung (stopped by timeout)"
  expect_no_leftovers
  if ((rc0 == 0 && rc1 == 0)); then
    [[ $(losses "$WORK/node0.log" | wc -l) -eq 40 ]] || fail "node 0 did not print 40 steps"
    diff <(losses "$WORK/reference.log") <(losses "$WORK/node0.log") >"$WORK/diff.log" ||
      fail "the job survived the flap with other losses: $(head -5 "$WORK/diff.log")"
    echo "survived a 2 s flap; 40 losses equal to the uninterrupted run's"
  else
    ((rc0 == 1 && rc1 == 1)) || fail "launcher statuses $rc0 and $rc1 after the flap, expected 0 0 or 1 1"
    expect_link_errors 0
    expect_link_errors 1
    echo "failed cleanly after the flap, within $(($(now_ms) - cut)) ms"
  fi
}

case_master_gone() {
  start_node 0 --steps 5
  # Rank 0's store: listening on host 0's address only, never on 0.0.0.0 or lo.
  local port_hex=733C i listeners
  for ((i = 0; i < 300; i++)); do
    listeners=$(host_exec 0 awk -v p=":$port_hex" '$4 == "0A" && substr($2, length($2) - 4) == p {print $2}' /proc/net/tcp /proc/net/tcp6)
    [[ -n $listeners ]] && break
    sleep 0.1
  done
  [[ -n $listeners ]] || fail "rank 0 never listened on port 29500"
  [[ $listeners == "0100630A:733C" ]] || fail "the store listens on $listeners, expected only 10.99.0.1 (0100630A:733C)"
  link_down 0
  local cut
  cut=$(now_ms)
  start_node 1 --steps 5
  expect_node_failed 1 "$cut"
  expect_node_failed 0 "$cut"
  expect_no_leftovers
  grep -qE "^\[rank [23]\] .*tcp://$(host_addr 0):29500.*$TIMEOUT_MS ms" "$WORK/node1.log" ||
    fail "node 1's ranks did not name the master's address and the timeout"
  grep -qE "^\[rank [01]\] .*rendezvous timed out after $TIMEOUT_MS ms waiting for key" "$WORK/node0.log" ||
    fail "node 0's ranks did not name the key they waited for"
}

case_restart_across() {
  TIMEOUT_MS=6000
  "${train[@]}" --steps 16 >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
  LAUNCH_OPTS=(--max-restarts 1)
  local k pid victim=
  for k in 0 1; do start_node "$k" --steps 16 --save "$WORK/ckpt" --save-every 2 --resume auto; done
  wait_for_line "$WORK/node0.log" "^\[rank 0\] step +$((3 + RANDOM % 4)) "
  for pid in $(host_pids 1); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(basename "$TRAIN" | cut -c1-15)" ]] || continue
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=3' && victim=$pid
  done
  [[ -n $victim ]] || fail "rank 3 not found on host 1"
  kill -KILL "$victim"
  for k in 0 1; do
    wait "${PID[k]}" || fail "node $k's launcher exited with $? after the restart"
  done
  expect_no_leftovers
  grep -qx "shardplan launch: node 1 of 2 ($(host_addr 1)): restart 1 of 1 after: rank 3 (pid $victim) was killed by signal 9 (SIGKILL)" \
    "$WORK/node1.log" || fail "node 1 did not restart after rank 3's SIGKILL"
  # Node 0 restarts on node 1's word (the launchers' store) or, if its ranks
  # noticed the lost peer first, on their failure.
  grep -qE "^shardplan launch: node 0 of 2 \($(host_addr 0)\): restart 1 of 1 after: (rank [01] |node 1 of 2 )" \
    "$WORK/node0.log" || fail "node 0 did not restart"
  grep -qE '^\[rank 0\] resumed from .* at step [0-9]+' "$WORK/node0.log" || fail "rank 0 did not resume"
  # Each step's loss, whichever start printed it, is one process's.
  join <(losses "$WORK/reference.log") <(losses "$WORK/node0.log") | awk '
    { d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > 1e-7 * s) { print "step " $1 ": " $2 " vs " $3; bad = 1 } n++ }
    END { if (n != 16) { print "compared " n " steps, expected 16"; bad = 1 } exit bad }' >"$WORK/diff.log" ||
    fail "losses differ from one process's: $(head -3 "$WORK/diff.log")"
  echo "rank 3 killed, both nodes restarted; 16 losses equal to one process's"
}

# start_sleepers FAIL_WHEN SLEEP_WHEN: both nodes with 2 shell ranks that
# print their start and store; on a start where the shell condition FAIL_WHEN
# holds rank 3 exits 3 after 1 s, where SLEEP_WHEN holds the others sleep
# 60 s, and then they print "finished".
start_sleepers() {
  local k prog='echo "start $SHARDPLAN_RESTART_COUNT store $SHARDPLAN_STORE"
    if '"$1"'; then [[ $RANK == 3 ]] && { sleep 1; exit 3; }; fi
    if '"$2"'; then exec sleep 60; fi; echo finished'
  rm -f "$WORK"/node*.log  # a wait_for_line must not read the last phase's
  for k in 0 1; do
    timeout -k 5 60 ip netns exec "$(hosts_ns "$k")" "$SP" launch -n 2 --nnodes 2 --node-rank "$k" \
      --master-addr "$(host_addr 0)" --master-port 29500 --local-addr "$(host_addr "$k")" --timeout-ms "$TIMEOUT_MS" \
      --max-restarts 1 -- bash -c "$prog" >"$WORK/node$k.log" 2>&1 &
    PID[k]=$!
  done
}
# node_re K: how node K names itself in a launcher line, as an extended regex.
node_re() { echo "node $1 of 2 \\($(host_addr "$1" | sed 's/\./\\./g')\\): "; }
SAYS='shardplan launch: '

case_restart_together() {
  TIMEOUT_MS=10000
  local k r t0 rc master=tcp://$(host_addr 0):29500 rank3='rank 3 \(pid [0-9]+\) exited with status 3'
  t0=$(now_ms)
  start_sleepers '[[ $SHARDPLAN_RESTART_COUNT == 0 ]]' '[[ $SHARDPLAN_RESTART_COUNT == 0 ]]'
  for k in 0 1; do wait "${PID[k]}" || fail "node $k's launcher exited with $? (the restart did not reach it?)"; done
  (($(now_ms) - t0 < 30000)) || fail "the restart took $(($(now_ms) - t0)) ms: node 0 waited for its ranks"
  expect_no_leftovers
  grep -Eqx "$SAYS$(node_re 1)restart 1 of 1 after: $rank3" "$WORK/node1.log" || fail "node 1 did not restart"
  grep -Eqx "$SAYS$(node_re 0)$(node_re 1)$rank3; stopping 2 rank\(s\)" \
    "$WORK/node0.log" || fail "node 0 did not stop its ranks on node 1's failure"
  grep -Eqx "$SAYS$(node_re 0)restart 1 of 1 after: $(node_re 1)$rank3" \
    "$WORK/node0.log" || fail "node 0 did not restart after node 1's failure"
  for r in 0 1 2 3; do
    k=$((r / 2))
    for t in 0 1; do
      grep -qx "\[rank $r\] start $t store $master/worker/attempt_$t" "$WORK/node$k.log" ||
        fail "rank $r did not start round $t on $master/worker/attempt_$t"
    done
    grep -qx "\[rank $r\] finished" "$WORK/node$k.log" || fail "rank $r did not finish round 1"
  done
  echo "rank 3 failed on host 1; both nodes restarted together in $(($(now_ms) - t0)) ms, round 1 on its own keys"

  start_sleepers true true
  for k in 0 1; do
    wait "${PID[k]}"; rc=$?
    ((rc == 1)) || fail "node $k's launcher exited with $rc after the restart limit, expected 1"
  done
  grep -Eqx "$SAYS$(node_re 1)giving up after 1 restart\(s\); the last failure: $rank3" "$WORK/node1.log" ||
    fail "node 1 did not give up naming rank 3"
  grep -Eqx "$SAYS$(node_re 0)giving up after 1 restart\(s\); the last failure: $(node_re 1)$rank3" \
    "$WORK/node0.log" || fail "node 0 did not give up naming node 1's rank 3"
  expect_no_leftovers
  echo "restart limit reached on both nodes together"

  start_sleepers false true
  wait_for_line "$WORK/node0.log" '^\[rank 1\] start 0 '
  wait_for_line "$WORK/node1.log" '^\[rank 3\] start 0 '
  t0=$(now_ms)
  kill -TERM "${PID[1]}"
  wait "${PID[1]}"; rc=$?
  ((rc == 143)) || fail "node 1's launcher exited with $rc after SIGTERM, expected 143"
  wait "${PID[0]}"; rc=$?
  ((rc == 1)) || fail "node 0's launcher exited with $rc when node 1 ended the job, expected 1"
  (($(now_ms) - t0 < 15000)) || fail "node 0 took $(($(now_ms) - t0)) ms to stop"
  grep -Eq "^$SAYS$(node_re 0)$(node_re 1)ended the job: received SIGTERM; stopping 2 rank\(s\)" \
    "$WORK/node0.log" || fail "node 0 did not name node 1's SIGTERM"
  grep -q "restart" "$WORK/node0.log" && fail "node 0 restarted after node 1 ended the job"
  expect_no_leftovers
  echo "node 1 stopped by SIGTERM; node 0 stopped its ranks and exited 1"

  # Node 1 never comes: node 0 starts no rank and fails within the timeout.
  TIMEOUT_MS=3000
  t0=$(now_ms)
  timeout -k 5 60 ip netns exec "$(hosts_ns 0)" "$SP" launch -n 2 --nnodes 2 --node-rank 0 --master-addr "$(host_addr 0)" \
    --master-port 29500 --local-addr "$(host_addr 0)" --timeout-ms "$TIMEOUT_MS" --max-restarts 1 -- bash -c 'echo started' \
    >"$WORK/node0.log" 2>&1
  rc=$?
  ((rc == 1)) || fail "node 0's launcher exited with $rc without node 1, expected 1"
  (($(now_ms) - t0 < TIMEOUT_MS + 5000)) || fail "node 0 took $(($(now_ms) - t0)) ms to give up on node 1"
  grep -Eqx "$SAYS$(node_re 0)node 1 did not join rendezvous round 0 within $TIMEOUT_MS ms" "$WORK/node0.log" ||
    fail "node 0 did not name node 1 and the timeout"
  grep -q started "$WORK/node0.log" && fail "node 0 started its ranks without node 1"
  echo "node 1 absent: node 0 gave up after $(($(now_ms) - t0)) ms, naming it"
}

case $CASE in
  link_down | link_flap | master_gone | restart_across | restart_together) "case_$CASE" ;;
  *) echo "usage: link_faults.sh link_down|link_flap|master_gone|restart_across|restart_together SHARDPLAN TRAIN_MODEL SOURCE_DIR" >&2; exit 2 ;;
esac
