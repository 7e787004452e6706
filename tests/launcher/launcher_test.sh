#!/usr/bin/env bash
# Tests of `shardplan launch`, one case per ctest test:
#   launcher_test.sh <shardplan> <launcher_probe> <case>
# The ranks are launcher_probe processes (see its --help).
set -u

SP=$1
PROBE=$2
CASE=$3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/launcher-test.XXXXXX")
TEST_NAME=$CASE
# shellcheck source-path=SCRIPTDIR source=test_lib.sh
source "$HERE/test_lib.sh"

# The variables the launcher owns must come from it, not from whoever runs ctest.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR \
  MASTER_PORT SHARDPLAN_BACKEND SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TIMEOUT_MS

# expected_env RANK LOCAL NPROC NNODES NODE ADDR PORT BACKEND STORE LOCAL_ADDR TIMEOUT STORE_DIR
expected_env() {
  local p="[rank $1]"
  printf '%s\n' "$p RANK=$1" "$p WORLD_SIZE=$(($3 * $4))" "$p LOCAL_RANK=$2" \
    "$p LOCAL_WORLD_SIZE=$3" "$p GROUP_RANK=$5" "$p GROUP_WORLD_SIZE=$4" "$p MASTER_ADDR=$6" \
    "$p MASTER_PORT=$7" "$p SHARDPLAN_BACKEND=$8" "$p SHARDPLAN_STORE=$9" \
    "$p SHARDPLAN_LOCAL_ADDR=${10}" "$p SHARDPLAN_TIMEOUT_MS=${11}" "$p STORE_DIR=${12}"
}

# The file:// store every rank saw; it must be one fresh directory, gone now.
single_store() {
  local stores
  stores=$(sed -n 's/^\[rank [0-9]*\] SHARDPLAN_STORE=//p' "$WORK/out" | sort -u)
  [[ $(printf '%s\n' "$stores" | wc -l) -eq 1 ]] || fail "ranks saw different stores: $stores"
  [[ $stores =~ ^file:///.*/shardplan-launch-[A-Za-z0-9]{6}/store$ ]] || fail "bad store URL '$stores'"
  local dir=${stores#file://}
  dir=${dir%/store}
  [[ ! -e $dir ]] || fail "store directory $dir still exists after the launcher exited"
  STORE=$stores
}

# signal_case RANK0 SIG: a launch with --max-restarts 3 whose rank 1 fails
# at start once $work/ready exists, and whose rank 0 runs the shell code
# RANK0 (which creates it; $launcher, $work, $sig, $rank0 are set) and then
# sleeps. The signal it sends must end the job at its first start.
signal_case() {
  cat >"$WORK/rank.sh" <<RANK
launcher=\$PPID work=\$1 sig=\$2 rank0=\$\$
if [[ \$RANK == 1 ]]; then
  while [[ ! -e \$work/ready ]]; do sleep 0.01; done
  exit 3
fi
echo "start \$SHARDPLAN_RESTART_COUNT"
$1
while :; do sleep 1 & wait \$!; done
RANK
  run launch -n 2 --max-restarts 3 -- bash "$WORK/rank.sh" "$WORK" "$2"
  expect_faster_than 30000
  expect_exact "$WORK/out" "[rank 0] start 0"
  ! grep -q 'restart' "$WORK/err" || fail "the launcher restarted after the signal"
}

case $CASE in
help)
  run --help
  expect_rc 0
  grep -q '^  launch ' "$WORK/out" || fail "'shardplan --help' does not list launch"
  expect_empty err
  run launch --help
  expect_rc 0
  [[ $(head -n 1 "$WORK/out") == "usage: shardplan launch -n N [options] [--] program [args...]" ]] ||
    fail "'shardplan launch --help' does not start with the usage line"
  grep -q -- '--nproc-per-node' "$WORK/out" || fail "help does not mention --nproc-per-node"
  expect_empty err
  run help launch
  expect_rc 0
  grep -q '^usage: shardplan launch' "$WORK/out" || fail "'shardplan help launch' shows no launch usage"
  run launch -n 2 -h
  expect_rc 0
  grep -q '^usage: shardplan launch' "$WORK/out" || fail "-h shows no usage"
  ;;

usage_errors)
  check_usage() {
    local expected=$1
    shift
    run "$@"
    [[ $RC -eq 2 ]] || fail "'$*' exited with $RC, expected 2"
    [[ ! -s $WORK/out ]] || fail "'$*' printed to stdout"
    expect_exact "$WORK/err" "$expected"
  }
  check_usage "shardplan: missing command (try 'shardplan --help')"
  check_usage "shardplan: unknown command 'lunch' (try 'shardplan --help')" lunch -n 2 -- true
  check_usage "shardplan launch: -n/--nproc-per-node is required" launch
  check_usage "shardplan launch: -n/--nproc-per-node is required" launch -- "$PROBE"
  check_usage "shardplan launch: -n/--nproc-per-node must be an integer from 1 to 1024, got '0'" \
    launch -n 0 -- "$PROBE"
  check_usage "shardplan launch: -n/--nproc-per-node must be an integer from 1 to 1024, got 'two'" \
    launch --nproc-per-node two -- "$PROBE"
  check_usage "shardplan launch: -n/--nproc-per-node must be an integer from 1 to 1024, got '2x'" \
    launch -n2x -- "$PROBE"
  check_usage "shardplan launch: no program given (usage: shardplan launch -n N [options] -- program [args...])" \
    launch -n 2
  check_usage "shardplan launch: no program given (usage: shardplan launch -n N [options] -- program [args...])" \
    launch -n 2 --
  check_usage "shardplan launch: unknown option '--bogus'" launch -n 2 --bogus -- "$PROBE"
  check_usage "shardplan launch: unknown option '-x'" launch -x -n 2 -- "$PROBE"
  check_usage "shardplan launch: option '--backend' needs a value" launch -n 2 --backend
  check_usage "shardplan launch: --backend must not be empty" launch -n 2 --backend= -- "$PROBE"
  check_usage "shardplan launch: backend 'local' runs ranks as threads of one process; run the program with --ranks N instead of the launcher" \
    launch -n 2 --backend local -- "$PROBE"
  check_usage "shardplan launch: --node-rank must be below --nnodes (2), got 2" \
    launch -n 2 --nnodes 2 --node-rank 2 -- "$PROBE"
  check_usage "shardplan launch: --node-rank must be below --nnodes (1), got 1" \
    launch -n 2 --node-rank 1 -- "$PROBE"
  check_usage "shardplan launch: --nnodes must be an integer from 1 to 1048576, got '0'" \
    launch -n 2 --nnodes 0 -- "$PROBE"
  check_usage "shardplan launch: --master-port must be an integer from 1 to 65535, got '70000'" \
    launch -n 2 --master-port 70000 -- "$PROBE"
  check_usage "shardplan launch: --timeout-ms must be an integer from 1 to 1000000000000, got '-5'" \
    launch -n 2 --timeout-ms -5 -- "$PROBE"
  check_usage "shardplan launch: --max-restarts must be an integer from 0 to 1000, got 'x'" \
    launch -n 2 --max-restarts x -- "$PROBE"
  check_usage "shardplan launch: --master-addr must not be empty" launch -n 2 --master-addr "" -- "$PROBE"
  check_usage "shardplan launch: --local-addr must not be empty" launch -n 2 --local-addr= -- "$PROBE"
  check_usage "shardplan launch: cannot execute '/nonexistent/prog': No such file or directory" \
    launch -n 2 -- /nonexistent/prog
  check_usage "shardplan launch: cannot execute 'shardplan-no-such-program': not found in PATH" \
    launch -n 2 shardplan-no-such-program
  check_usage "shardplan launch: cannot execute '$WORK': Is a directory" launch -n 2 -- "$WORK"
  ;;

env_single_node)
  # Values exported by the caller must not leak into the ranks.
  RANK=99 WORLD_SIZE=99 SHARDPLAN_STORE=tcp://bogus:1 MASTER_PORT=1 run launch -n 2 -- "$PROBE" --env
  expect_rc 0
  expect_empty err
  single_store
  expect_lines "$WORK/out" "$(
    expected_env 0 0 2 1 0 127.0.0.1 29500 gloo "$STORE" '<unset>' '<unset>' exists
    expected_env 1 1 2 1 0 127.0.0.1 29500 gloo "$STORE" '<unset>' '<unset>' exists
  )"
  ;;

env_options)
  # torchrun spellings too; the program without '--'.
  run launch --nproc_per_node=3 --backend nccl --master-addr 10.1.2.3 --master_port 29777 \
    --local-addr 127.0.0.3 --timeout-ms 1234 "$PROBE" --env
  expect_rc 0
  expect_empty err
  single_store
  expect_lines "$WORK/out" "$(
    for r in 0 1 2; do
      expected_env $r $r 3 1 0 10.1.2.3 29777 nccl "$STORE" 127.0.0.3 1234 exists
    done
  )"
  ;;

env_node_rank)
  # The second node of three, alone: enough to check the numbering.
  run launch -n 2 --nnodes 3 --node-rank 1 --master-addr 10.0.0.1 --master-port 1234 -- "$PROBE" --env
  expect_rc 0
  expect_empty err
  expect_lines "$WORK/out" "$(
    expected_env 2 0 2 3 1 10.0.0.1 1234 gloo tcp://10.0.0.1:1234 '<unset>' '<unset>' n/a
    expected_env 3 1 2 3 1 10.0.0.1 1234 gloo tcp://10.0.0.1:1234 '<unset>' '<unset>' n/a
  )"
  ;;

two_nodes_env)
  port=$("$PROBE" --free-port) || fail "launcher_probe --free-port failed"
  [[ $port =~ ^[0-9]+$ ]] || fail "bad free port '$port'"
  start=$(now_ms)
  bash "$HERE/two_nodes.sh" "$SP" 2 "$port" --timeout-ms 5000 -- "$PROBE" --env >"$WORK/out" 2>"$WORK/err"
  RC=$?
  expect_rc 0
  expect_empty err
  store=tcp://127.0.0.1:$port
  expect_lines "$WORK/out" "$(
    expected_env 0 0 2 2 0 127.0.0.1 "$port" gloo "$store" 127.0.0.1 5000 n/a
    expected_env 1 1 2 2 0 127.0.0.1 "$port" gloo "$store" 127.0.0.1 5000 n/a
    expected_env 2 0 2 2 1 127.0.0.1 "$port" gloo "$store" 127.0.0.2 5000 n/a
    expected_env 3 1 2 2 1 127.0.0.1 "$port" gloo "$store" 127.0.0.2 5000 n/a
  )"
  ;;

restart_limit)
  # Rank 1 fails on every start: 2 restarts, each a new rendezvous (store) with
  # the count exported, then the launcher gives up naming the last failure.
  # Rank 1 fails 300 ms in, so that rank 0 has printed before it is stopped.
  "$SP" launch -n 2 --max-restarts 2 -- "$PROBE" --print-env SHARDPLAN_RESTART_COUNT \
    --print-env TORCHELASTIC_RESTART_COUNT --print-env SHARDPLAN_STORE --sleep-ms 300 --if-rank 1 --exit 3 --sleep-ms 30000 \
    >"$WORK/out" 2>"$WORK/err"
  RC=$?
  expect_rc 1
  for n in 0 1 2; do
    for r in 0 1; do
      grep -qx "\[rank $r\] SHARDPLAN_RESTART_COUNT=$n" "$WORK/out" || fail "rank $r did not see SHARDPLAN_RESTART_COUNT=$n"
      grep -qx "\[rank $r\] TORCHELASTIC_RESTART_COUNT=$n" "$WORK/out" || fail "rank $r did not see TORCHELASTIC_RESTART_COUNT=$n"
    done
  done
  [[ $(sed -n 's/^\[rank 0\] SHARDPLAN_STORE=//p' "$WORK/out" | sort -u | wc -l) -eq 3 ]] ||
    fail "the three starts did not get three stores"
  grep -Eqx "shardplan launch: restart 1 of 2 after: rank 1 \(pid [0-9]+\) exited with status 3" "$WORK/err" ||
    fail "no line for restart 1"
  grep -Eqx "shardplan launch: restart 2 of 2 after: rank 1 \(pid [0-9]+\) exited with status 3" "$WORK/err" ||
    fail "no line for restart 2"
  grep -Eqx "shardplan launch: giving up after 2 restart\(s\); the last failure: rank 1 \(pid [0-9]+\) exited with status 3" \
    "$WORK/err" || fail "no final verdict naming the last failure"
  [[ $(grep -c '^shardplan launch: restart' "$WORK/err") -eq 2 ]] || fail "expected exactly 2 restarts"
  ;;

signal_in_stop_sigterm | signal_in_stop_sigint)
  # Rank 1 fails at start; while the launcher stops rank 0 for the restart,
  # rank 0 (on that SIGTERM) sends the launcher a signal of its own, then
  # waits for the launcher to pass it on. The signal ends the job: 128 + N,
  # not the restarts (it used to be taken for a second Ctrl-C and then lost).
  if [[ $CASE == signal_in_stop_sigint ]]; then sig=INT signo=2; else sig=TERM signo=15; fi
  signal_case 'trap "trap \"exit 0\" TERM INT; kill -$sig $launcher" TERM
    touch "$work/ready"' $sig
  expect_rc $((128 + signo))
  grep -Eqx "shardplan launch: rank 1 \(pid [0-9]+\) exited with status 3; terminating 1 other rank\(s\)" "$WORK/err" ||
    fail "no verdict on rank 1"
  grep -qx "shardplan launch: received SIG$sig while stopping 1 rank(s) after a failure; forwarding it, and the job ends" \
    "$WORK/err" || fail "the launcher did not take the signal"
  ;;

signal_after_ranks)
  # The same signal once the ranks are gone, while the launcher clears what
  # they left in their process groups (rank 0's child, deaf to SIGTERM).
  signal_case '(
      trap "" TERM
      touch "$work/ready"
      while kill -0 $rank0 2>/dev/null; do sleep 0.01; done
      kill -TERM $launcher
      exec sleep 300
    ) &' TERM
  expect_rc 143
  grep -qx "shardplan launch: received SIGTERM after the ranks ended; the job ends here" "$WORK/err" ||
    fail "the launcher did not take the signal"
  ;;

two_nodes_failure)
  # Rank 2 (node 1) fails; node 0's ranks would otherwise sleep for 300 s.
  port=$("$PROBE" --free-port) || fail "launcher_probe --free-port failed"
  start=$(now_ms)
  bash "$HERE/two_nodes.sh" "$SP" 2 "$port" -- "$PROBE" --pidfile "$WORK" \
    --if-rank 2 --sleep-ms 500 --if-rank 2 --exit 5 --sleep-ms 300000 >"$WORK/out" 2>"$WORK/err"
  RC=$?
  ELAPSED_MS=$(($(now_ms) - start))
  expect_rc 1
  expect_faster_than 30000
  grep -qx "shardplan launch: node 1 of 2 (127.0.0.2): rank 2 (pid $(pid_of rank2)) exited with status 5; terminating 1 other rank(s)" \
    "$WORK/err" || fail "node 1's launcher did not report rank 2"
  grep -qx "two_nodes.sh: node 1's launcher exited with status 1; stopping node 0" "$WORK/err" ||
    fail "two_nodes.sh did not report stopping node 0"
  grep -qx "shardplan launch: node 0 of 2 (127.0.0.1): received SIGTERM; forwarding it to 2 rank(s)" "$WORK/err" ||
    fail "node 0's launcher did not forward SIGTERM"
  grep -qx "two_nodes.sh: launcher exit statuses: node 0 143, node 1 1" "$WORK/err" ||
    fail "two_nodes.sh did not summarise the exit statuses"
  expect_dead rank0 rank1 rank2 rank3
  ;;

prefix_many_lines)
  n=3000
  run launch -n 3 -- "$PROBE" --lines $n --err-lines $n
  expect_rc 0
  expect_probe_lines $n
  ;;

partial_line)
  run launch -n 2 -- "$PROBE" --lines 2 --partial "tail without newline"
  expect_rc 0
  expect_empty err
  for r in 0 1; do
    grep "^\[rank $r\] " "$WORK/out" >"$WORK/rank$r"
    expect_exact "$WORK/rank$r" "[rank $r] rank $r line 0 
[rank $r] rank $r line 1 $(printf 'x%.0s' $(seq 37))
[rank $r] tail without newline"
  done
  [[ $(wc -l <"$WORK/out") -eq 6 ]] || fail "expected 6 lines"
  ;;

all_zero)
  run launch -n 3 -- "$PROBE" --sleep-ms 100 --exit 0
  expect_rc 0
  expect_empty out
  expect_empty err
  ;;

fail_fast)
  # Rank 1's last words come before the launcher's verdict on it.
  run launch -n 4 -- "$PROBE" --pidfile "$WORK" --if-rank 1 --sleep-ms 500 --if-rank 1 --err-lines 1 \
    --if-rank 1 --exit 3 --sleep-ms 300000
  expect_rc 1
  expect_faster_than 30000
  expect_exact "$WORK/err" "[rank 1] rank 1 err 0 
shardplan launch: rank 1 (pid $(pid_of rank1)) exited with status 3; terminating 3 other rank(s)"
  expect_empty out
  expect_dead rank0 rank1 rank2 rank3
  ;;

killed_by_signal)
  run launch -n 2 -- "$PROBE" --pidfile "$WORK" --if-rank 0 --sleep-ms 500 --if-rank 0 --kill 9 \
    --sleep-ms 300000
  expect_rc 1
  expect_faster_than 30000
  expect_exact "$WORK/err" \
    "shardplan launch: rank 0 (pid $(pid_of rank0)) was killed by signal 9 (SIGKILL); terminating 1 other rank(s)"
  expect_dead rank0 rank1
  ;;

sigkill_escalation)
  # Rank 1 ignores SIGTERM: only SIGKILL, 5 s later, ends it.
  run launch -n 2 -- "$PROBE" --pidfile "$WORK" --ignore-term --if-rank 0 --sleep-ms 500 \
    --if-rank 0 --exit 4 --sleep-ms 300000
  expect_rc 1
  ((ELAPSED_MS >= 5000)) || fail "SIGKILL came after ${ELAPSED_MS} ms, before the 5 s grace period"
  expect_faster_than 30000
  expect_exact "$WORK/err" \
    "shardplan launch: rank 0 (pid $(pid_of rank0)) exited with status 4; terminating 1 other rank(s)
shardplan launch: 1 rank(s) still running 5 s after SIGTERM; sending SIGKILL"
  expect_dead rank0 rank1
  ;;

leftover_descendants)
  # Rank 0 leaves a child behind that holds its stdout; the launcher must
  # neither wait 300 s for it nor leave it running.
  run launch -n 2 -- "$PROBE" --if-rank 0 --grandchild "$WORK" --exit 0
  expect_rc 0
  expect_faster_than 10000
  expect_empty err
  expect_dead grandchild0
  # The same when a rank with such a child fails and the others are stopped.
  run launch -n 3 -- "$PROBE" --pidfile "$WORK" --grandchild "$WORK" --if-rank 2 --sleep-ms 500 \
    --if-rank 2 --exit 7 --sleep-ms 300000
  expect_rc 1
  expect_faster_than 30000
  expect_exact "$WORK/err" \
    "shardplan launch: rank 2 (pid $(pid_of rank2)) exited with status 7; terminating 2 other rank(s)"
  expect_dead rank0 rank1 rank2 grandchild0 grandchild1 grandchild2
  ;;

forward_sigterm | forward_sigint)
  if [[ $CASE == forward_sigint ]]; then sig=INT signo=2; else sig=TERM signo=15; fi
  # Job control, so the background launcher does not start with SIGINT ignored.
  set -m
  "$SP" launch -n 2 -- "$PROBE" --pidfile "$WORK" --sleep-ms 300000 >"$WORK/out" 2>"$WORK/err" &
  launcher=$!
  BG_PIDS+=("$launcher")
  set +m
  wait_for_files rank0.pid rank1.pid
  start=$(now_ms)
  kill -$sig "$launcher"
  wait "$launcher"
  RC=$?
  ELAPSED_MS=$(($(now_ms) - start))
  expect_rc $((128 + signo))
  expect_faster_than 10000
  expect_exact "$WORK/err" "shardplan launch: received SIG$sig; forwarding it to 2 rank(s)"
  expect_dead rank0 rank1
  ;;

thread_env)
  # Each rank's CPU threads: the cores the launcher may use shared out among
  # its ranks, for libtorch (OMP) and the BLAS pool alike; set values stay.
  unset SHARDPLAN_NUM_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS
  show='echo "$SHARDPLAN_NUM_THREADS $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS"'
  pinned() { timeout -k 5 60 taskset -c 0,1 "$SP" "$@" >"$WORK/out" 2>"$WORK/err"; RC=$?; }
  pinned launch -n 2 -- sh -c "$show"
  expect_rc 0
  expect_lines "$WORK/out" "$(printf '[rank %s] 1 1 1\n' 0 1)"
  pinned launch -n 1 -- sh -c "$show"
  expect_rc 0
  expect_lines "$WORK/out" "[rank 0] 2 2 2"
  OMP_NUM_THREADS=3 pinned launch -n 2 -- sh -c "$show"
  expect_rc 0
  expect_lines "$WORK/out" "$(printf '[rank %s] 1 3 1\n' 0 1)"
  SHARDPLAN_NUM_THREADS=2 pinned launch -n 2 -- sh -c "$show"
  expect_rc 0
  expect_lines "$WORK/out" "$(printf '[rank %s] 2 2 2\n' 0 1)"
  ;;

exec_failure)
  # Passes the launcher's check but fails in execve (missing interpreter):
  # every rank reports it on its stderr, and the launcher gives its verdict.
  printf '#!/nonexistent/interpreter\n' >"$WORK/script"
  chmod +x "$WORK/script"
  run launch -n 2 -- "$WORK/script"
  expect_rc 1
  expect_faster_than 30000
  expect_empty out
  msg="shardplan launch: cannot execute '$WORK/script': No such file or directory"
  verdicts=$(grep -Ex "shardplan launch: rank [01] \(pid [0-9]+\) exited with status 127(; terminating 1 other rank\(s\))?" "$WORK/err")
  [[ $(grep -c '^shardplan launch:' "$WORK/err") -eq 1 && -n $verdicts ]] ||
    fail "expected exactly one verdict, on a rank exiting with 127"
  failed_rank=$(sed 's/^shardplan launch: rank \([01]\).*/\1/' <<<"$verdicts")
  # The other rank may be stopped before it gets to say anything.
  grep -qx "\[rank $failed_rank\] $msg" "$WORK/err" || fail "rank $failed_rank's exec error is missing"
  [[ $(grep -vx "\[rank [01]\] $msg" "$WORK/err" | wc -l) -eq 1 ]] || fail "unexpected lines on stderr"
  ;;

*)
  fail "unknown case"
  ;;
esac
echo "PASS [$CASE] (${ELAPSED_MS:-0} ms)"
