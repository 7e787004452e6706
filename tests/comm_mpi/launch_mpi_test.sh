#!/usr/bin/env bash
# Tests of `shardplan launch --backend mpi` (the launcher runs mpirun as its
# one child), one case per ctest test:
#   launch_mpi_test.sh <shardplan> <launcher_probe> <case>
# The ranks are launcher_probe processes, or a shell where the probe cannot
# show what is checked.
set -u

SP=$1
PROBE=$2
CASE=$3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/launch-mpi-test.XXXXXX")
TEST_NAME=mpi_$CASE
# shellcheck source-path=SCRIPTDIR source=../launcher/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../launcher/test_lib.sh"

# The launcher must manage without them (it sets them itself as root).
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM SHARDPLAN_BACKEND SHARDPLAN_TIMEOUT_MS OMP_NUM_THREADS

case $CASE in
env)
  # torchrun's variables and a store from the caller must not reach the
  # ranks: WorldOptions::from_env would prefer them to Open MPI's.
  RANK=7 WORLD_SIZE=9 LOCAL_RANK=7 MASTER_ADDR=10.9.9.9 SHARDPLAN_STORE=file:///nowhere \
    run launch -n 3 --backend mpi --timeout-ms 4321 -- bash -c \
    'echo "rank=$OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE local=$OMPI_COMM_WORLD_LOCAL_RANK backend=$SHARDPLAN_BACKEND timeout=$SHARDPLAN_TIMEOUT_MS omp=$OMP_NUM_THREADS torchrun=${RANK-}${WORLD_SIZE-}${LOCAL_RANK-}${MASTER_ADDR-} store=${SHARDPLAN_STORE-none}"'
  expect_rc 0
  expect_empty err
  expect_lines "$WORK/out" "$(for r in 0 1 2; do
    echo "[rank $r] rank=$r/3 local=$r backend=mpi timeout=4321 omp=1 torchrun= store=none"
  done)"
  ;;

prefix_many_lines)
  # mpirun tags every line "[job,rank]<stdout>:"; the launcher turns that into
  # its own prefix, lines whole and in order per rank, on the right stream.
  n=3000
  run launch -n 3 --backend mpi -- "$PROBE" --lines $n --err-lines $n
  expect_rc 0
  expect_probe_lines $n
  ;;

partial_line)
  # mpirun tags a piece without a newline too, and the next piece of any rank
  # follows it on the same line.
  run launch -n 2 --backend mpi -- "$PROBE" --lines 2 --partial "tail without newline"
  expect_rc 0
  expect_empty err
  expect_lines "$WORK/out" "$(for r in 0 1; do
    echo "[rank $r] rank $r line 0 "
    echo "[rank $r] rank $r line 1 $(printf 'x%.0s' $(seq 37))"
    echo "[rank $r] tail without newline"
  done)"
  ;;

fail_fast)
  # mpirun ends the job when a rank fails; the launcher reports it and exits 1.
  run launch -n 4 --backend mpi -- "$PROBE" --pidfile "$WORK" --if-rank 1 --sleep-ms 500 \
    --if-rank 1 --err-lines 1 --if-rank 1 --exit 3 --sleep-ms 300000
  expect_rc 1
  expect_faster_than 30000
  grep -qx "\[rank 1\] rank 1 err 0 " "$WORK/err" || fail "rank 1's last words are missing"
  grep -qEx "shardplan launch: mpirun \(pid [0-9]+\) exited with status 3" "$WORK/err" ||
    fail "no verdict on mpirun"
  expect_dead rank0 rank1 rank2 rank3
  ;;

forward_sigterm)
  set -m
  "$SP" launch -n 2 --backend mpi -- "$PROBE" --pidfile "$WORK" --sleep-ms 300000 >"$WORK/out" 2>"$WORK/err" &
  launcher=$!
  BG_PIDS+=("$launcher")
  set +m
  wait_for_files rank0.pid rank1.pid
  start=$(now_ms)
  kill -TERM "$launcher"
  wait "$launcher"
  RC=$?
  ELAPSED_MS=$(($(now_ms) - start))
  expect_rc 143
  expect_faster_than 10000
  grep -qx "shardplan launch: received SIGTERM; forwarding it to mpirun" "$WORK/err" ||
    fail "the launcher did not forward SIGTERM"
  # mpirun may take a moment to reap its ranks after it is gone itself.
  deadline=$(($(now_ms) + 5000))
  while (kill -0 "$(pid_of rank0)" || kill -0 "$(pid_of rank1)") 2>/dev/null && (($(now_ms) < deadline)); do
    sleep 0.05
  done
  expect_dead rank0 rank1
  ;;

multi_node_refused)
  run launch -n 2 --nnodes 2 --backend mpi -- "$PROBE"
  expect_rc 2
  expect_empty out
  grep -q "use mpirun with a hostfile" "$WORK/err" || fail "no hint to use mpirun with a hostfile"
  ;;

restarts)
  # --max-restarts with mpirun: a failed rank ends mpirun, the launcher starts
  # a new one with the restart count exported to every rank (-x). Rank 1
  # fails on the first start only; on the second both finish.
  run launch -n 2 --backend mpi --max-restarts 2 -- bash -c \
    'echo "start=$SHARDPLAN_RESTART_COUNT/$TORCHELASTIC_RESTART_COUNT"; [[ $SHARDPLAN_RESTART_COUNT != 0 || $OMPI_COMM_WORLD_RANK != 1 ]] || exit 3; sleep 0.5'
  expect_rc 0
  for r in 0 1; do
    for n in 0 1; do grep -qx "\[rank $r\] start=$n/$n" "$WORK/out" || fail "rank $r did not print start=$n/$n"; done
  done
  grep -q "start=2" "$WORK/out" && fail "a third start after the second succeeded"
  [[ $(grep -c '^shardplan launch: restart 1 of 2 after: mpirun (pid [0-9]*) exited with status ' "$WORK/err") -eq 1 ]] ||
    fail "no single line for the restart after mpirun's failure"
  # A failure on every start: the limit ends it with the last cause.
  run launch -n 2 --backend mpi --max-restarts 1 -- bash -c '[[ $OMPI_COMM_WORLD_RANK != 1 ]] || exit 3; sleep 0.5'
  expect_rc 1
  grep -Eq '^shardplan launch: giving up after 1 restart\(s\); the last failure: mpirun \(pid [0-9]+\) exited with status ' \
    "$WORK/err" || fail "no final verdict after the restart limit"
  ;;

*)
  fail "unknown case"
  ;;
esac
exit 0
