#!/usr/bin/env bash
# Runtime faults through `shardplan launch` with real processes, one case per
# ctest test:
#   faults_test.sh <shardplan> <fault_probe> <launcher_probe> <train_model> <source dir> <tests binary dir> <case>
# The ranks are fault_probe (see its --help) or the example trainer. Every
# timeout is a few seconds; a case that hangs fails at the 60 s guard of `run`.
set -u

SP=$1
FP=$2
LP=$3
TM=$4
SRC=$5
BIN=$6
CASE=$7
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/faults-test.XXXXXX")
TEST_NAME=faults.$CASE
# shellcheck source-path=SCRIPTDIR source=../launcher/test_lib.sh
source "$HERE/../launcher/test_lib.sh"

unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR \
  MASTER_PORT SHARDPLAN_BACKEND SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR SHARDPLAN_TIMEOUT_MS SHARDPLAN_PLUGIN_PATH
# Where the build puts the plugins that ship (the install layout).
INSTALL_PLUGINS=$(cd "$(dirname "$SP")/../lib/shardplan/plugins" && pwd)
# A small GPT that trains forever, one log line per step.
TRAIN=("$TM" --model gpt --plan "$SRC/plans/gpt.yaml" --config "embed=32,layers=1,mlp=64" --batch 2
  --steps 1000000 --log-every 1 --threads 1)

expect_line() { grep -Fqx -- "$2" "$WORK/$1" || fail "std$1 lacks the line: $2"; }
expect_line_re() { grep -qEx -- "$2" "$WORK/$1" || fail "std$1 lacks a line matching: $2"; }
# The line after the launcher's '[rank K] ' prefix, for messages with regex characters.
expect_rank_line() {
  local f=$1 r=$2 text=$3
  grep -Fqx -- "[rank $r] $text" "$WORK/$f" || fail "std$f lacks rank $r's line: $text"
}
wait_for_line() {  # FILE REGEX: waits (60 s at most) until FILE has a line matching REGEX
  local deadline=$(($(now_ms) + 60000))
  until grep -qE -- "$2" "$1" 2>/dev/null; do
    (($(now_ms) < deadline)) || fail "timed out waiting for '$2' in $(basename "$1")"
    sleep 0.1
  done
}
# descendants PID: every process below PID.
descendants() {
  local c kids
  kids=$(cat /proc/"$1"/task/*/children 2>/dev/null)
  for c in $kids; do
    echo "$c"
    descendants "$c"
  done
}
# rank_pid PID VAR VALUE: the process below PID whose environment has VAR=VALUE.
rank_pid() {
  local p
  for p in $(descendants "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$2=$3"; then
      echo "$p"
      return 0
    fi
  done
  fail "no process below $1 with $2=$3"
}
alive() { kill -0 "$1" 2>/dev/null; }
# start_bg NAME ARGS...: runs ARGS in the background, output in $WORK/NAME.out/.err; pid in BG.
start_bg() {
  local name=$1
  shift
  "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  BG=$!
  BG_PIDS+=("$BG")
}
# wait_bg PID LIMIT_MS: waits for PID, failing after LIMIT_MS; sets RC.
wait_bg() {
  local deadline=$(($(now_ms) + $2))
  while alive "$1"; do
    (($(now_ms) < deadline)) || fail "pid $1 still running after $2 ms"
    sleep 0.05
  done
  wait "$1"
  RC=$?
}
# Two launchers as two nodes of one rank each, meeting at 127.0.0.1:$PORT.
node_cmd() {  # node_cmd NODE ARGS... (launch options end at --)
  local node=$1
  shift
  NODE_CMD=("$SP" launch -n 1 --nnodes 2 --node-rank "$node" --master-addr 127.0.0.1 --master-port "$PORT"
    --local-addr "127.0.0.$((node + 1))" --backend gloo "$@")
}
free_port() { PORT=$("$LP" --free-port) || fail "launcher_probe --free-port failed"; }
# train_with_plan_plugins DIR OPT_IN: the trainer on gpt.yaml behind `plugins: [DIR]`,
# with SHARDPLAN_PLAN_PLUGINS=OPT_IN (only 1 opts in); expected to fail fast.
train_with_plan_plugins() {
  { echo "plugins: [$1]"; cat "$SRC/plans/gpt.yaml"; } >"$WORK/plan.yaml"
  SHARDPLAN_PLAN_PLUGINS=$2 run launch -n 2 --backend gloo --timeout-ms 5000 -- "${TRAIN[@]}" --plan "$WORK/plan.yaml"
  expect_rc 1
  expect_faster_than 30000
}

case $CASE in
collective_timeout | collective_timeout_group | collective_timeout_mpi)
  # Rank 1 never calls the collective; rank 0 gives up after the 2 s
  # timeout, naming the collective and the group, and the launcher ends the job.
  backend=gloo group=world coll=all_reduce
  [[ $CASE == collective_timeout_group ]] && group=model coll=all_gather
  [[ $CASE == collective_timeout_mpi ]] && backend=mpi
  run launch -n 2 --backend $backend --timeout-ms 2000 -- "$FP" --init --group $group --if-rank 1 --sleep-ms 60000 \
    --collective $coll
  expect_rc 1
  ((ELAPSED_MS >= 2000)) || fail "gave up after ${ELAPSED_MS} ms, before the 2000 ms timeout"
  expect_faster_than 30000
  expect_line_re err "\[rank 0\] fault_probe: error: $backend $coll on group '$group' \(rank 0 of 2\): .* \(a rank of group '$group' did not join it, or it could not finish, within 2000 ms; the limit is SHARDPLAN_TIMEOUT_MS, or shardplan launch --timeout-ms\)"
  if [[ $backend == mpi ]]; then
    expect_line_re err "shardplan launch: mpirun \(pid [0-9]+\) exited with status 1"
  else
    expect_line_re err "shardplan launch: rank 0 \(pid [0-9]+\) exited with status 1; terminating 1 other rank\(s\)"
  fi
  grep -q "rank 1: $coll done" "$WORK/out" && fail "rank 1 ran the collective"
  ;;

rank_killed | rank_killed_mpi)
  # SIGKILL to rank 1 in the middle of training: the job ends with a non-zero
  # status within the timeout, and the dead rank is named (by the launcher;
  # under mpi by mpirun, whose report the launcher passes on).
  backend=gloo var=RANK
  [[ $CASE == rank_killed_mpi ]] && backend=mpi var=OMPI_COMM_WORLD_RANK
  start_bg job "$SP" launch -n 2 --backend $backend --timeout-ms 3000 -- "${TRAIN[@]}"
  launcher=$BG
  wait_for_line "$WORK/job.out" '^\[rank 0\] step +3 '
  victim=$(rank_pid "$launcher" $var 1) || exit 1
  survivor=$(rank_pid "$launcher" $var 0) || exit 1
  start=$(now_ms)
  kill -KILL "$victim"
  wait_bg "$launcher" 30000
  ELAPSED_MS=$(($(now_ms) - start))
  [[ $RC -ne 0 ]] || fail "the job exited 0 after a rank was killed"
  alive "$survivor" && fail "rank 0 (pid $survivor) outlived the job"
  cp "$WORK/job.err" "$WORK/err"
  cp "$WORK/job.out" "$WORK/out"
  if [[ $backend == mpi ]]; then
    expect_line_re err "mpirun noticed that process rank 1 with PID [0-9]+ on node .* exited on signal 9 \(Killed\)\."
    expect_line_re err "shardplan launch: mpirun \(pid [0-9]+\) exited with status [0-9]+"
  else
    expect_rc 1
    expect_line err "shardplan launch: rank 1 (pid $victim) was killed by signal 9 (SIGKILL); terminating 1 other rank(s)"
    [[ $(grep -c '^shardplan launch:' "$WORK/err") -eq 1 ]] || fail "expected one verdict from the launcher"
  fi
  expect_faster_than 15000
  ;;

rank_killed_two_nodes)
  # As above across two launchers (nodes): nobody stops node 0, so its rank
  # must notice by itself that rank 1 is gone, fail, and exit non-zero within
  # the 3 s timeout; each launcher names its rank.
  free_port
  node_cmd 0 --timeout-ms 3000 -- "${TRAIN[@]}"
  start_bg node0 "${NODE_CMD[@]}"
  node0=$BG
  node_cmd 1 --timeout-ms 3000 -- "${TRAIN[@]}"
  start_bg node1 "${NODE_CMD[@]}"
  node1=$BG
  wait_for_line "$WORK/node0.out" '^\[rank 0\] step +3 '
  victim=$(rank_pid "$node1" RANK 1) || exit 1
  survivor=$(rank_pid "$node0" RANK 0) || exit 1
  start=$(now_ms)
  kill -KILL "$victim"
  wait_bg "$node1" 30000
  [[ $RC -eq 1 ]] || fail "node 1's launcher exited with $RC, expected 1"
  wait_bg "$node0" 30000
  ELAPSED_MS=$(($(now_ms) - start))
  [[ $RC -eq 1 ]] || fail "node 0's launcher exited with $RC, expected 1"
  cat "$WORK/node0.err" "$WORK/node1.err" >"$WORK/err"
  expect_line err "shardplan launch: node 1 of 2 (127.0.0.2): rank 1 (pid $victim) was killed by signal 9 (SIGKILL)"
  expect_line err "shardplan launch: node 0 of 2 (127.0.0.1): rank 0 (pid $survivor) exited with status 1"
  expect_line_re err "\[rank 0\] train_model: error: gloo [a-z_]+ on group '[a-z]+' \(rank 0 of 2\): .*"
  expect_faster_than 15000
  ;;

model_mismatch)
  # Node 1's model has a narrower MLP. Each rank stops by itself, naming the
  # first parameter that differs, before any sharding.
  free_port
  node_cmd 0 --timeout-ms 5000 -- "${TRAIN[@]}"
  start_bg node0 "${NODE_CMD[@]}"
  node0=$BG
  node_cmd 1 --timeout-ms 5000 -- "${TRAIN[@]}" --config mlp=48
  start_bg node1 "${NODE_CMD[@]}"
  node1=$BG
  wait_bg "$node0" 60000
  [[ $RC -eq 1 ]] || fail "node 0's launcher exited with $RC, expected 1"
  wait_bg "$node1" 60000
  [[ $RC -eq 1 ]] || fail "node 1's launcher exited with $RC, expected 1"
  cat "$WORK/node0.err" "$WORK/node1.err" >"$WORK/err"
  msg="train_model: error: parallelize: rank 1's model has parameter 'blocks.0.fc1.weight' [48, 32] float32 where rank 0 has [64, 32] float32; every rank must apply the same plan to the same model"
  expect_rank_line err 0 "$msg"
  expect_rank_line err 1 "$msg"
  grep -q 'step ' "$WORK/node0.out" "$WORK/node1.out" && fail "a rank started training"
  ;;

plan_mismatch)
  # One launcher; rank 1 is given another plan through its RANK. Whichever
  # rank the launcher hears from first names the differing rule.
  sed 's/layout: \[model, null\]/layout: [null, model]/' "$SRC/plans/gpt.yaml" >"$WORK/other.yaml"
  # shellcheck disable=SC2016 # expanded by the rank's shell
  run launch -n 2 --backend gloo --timeout-ms 5000 -- bash -c \
    'p=$1; [ "$RANK" = 1 ] && p=$2; shift 2; exec "$@" --plan "$p"' \
    pick "$SRC/plans/gpt.yaml" "$WORK/other.yaml" "${TRAIN[@]}"
  expect_rc 1
  msg="train_model: error: parallelize: rank 1 runs a different plan than rank 0: rule 1 (match: 'tok_emb\\.weight') differs: rank 1's plan ($WORK/other.yaml) has \"layout: [null, model]\" where rank 0's ($SRC/plans/gpt.yaml) has \"layout: [model, null]\"; every rank must apply the same plan to the same model"
  grep -Fqx -- "[rank 0] $msg" "$WORK/err" || grep -Fqx -- "[rank 1] $msg" "$WORK/err" ||
    fail "no rank printed: $msg"
  [[ $(grep -c 'error:' "$WORK/err") -eq $(grep -cF -- "$msg" "$WORK/err") ]] || fail "a rank printed another error"
  expect_line_re err "shardplan launch: rank [01] \(pid [0-9]+\) exited with status 1; terminating 1 other rank\(s\)"
  grep -q 'step ' "$WORK/out" && fail "a rank started training"
  ;;

rendezvous_timeout)
  # Node 1 never comes: node 0's rank serves the store and gives up after 2 s.
  free_port
  run launch -n 1 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$PORT" --timeout-ms 2000 \
    -- "$FP" --init
  expect_rc 1
  ((ELAPSED_MS >= 2000)) || fail "gave up after ${ELAPSED_MS} ms, before the 2000 ms timeout"
  expect_faster_than 30000
  expect_line_re err "\[rank 0\] fault_probe: error: backend 'gloo': rank 0 of 2 could not join the world: .*rendezvous timed out after 2000 ms waiting for key '[^']+' at tcp://127\.0\.0\.1:$PORT"
  expect_line_re err "shardplan launch: node 0 of 2: rank 0 \(pid [0-9]+\) exited with status 1"
  ;;

rendezvous_timeout_file)
  # One node, the launcher's file store; rank 1 arrives too late.
  run launch -n 2 --timeout-ms 2000 -- "$FP" --if-rank 1 --sleep-ms 60000 --init
  expect_rc 1
  expect_faster_than 30000
  expect_line_re err "\[rank 0\] fault_probe: error: backend 'gloo': rank 0 of 2 could not join the world: .*rendezvous timed out after 2000 ms waiting for key '[^']+' at file:///.*/store"
  expect_line_re err "shardplan launch: rank 0 \(pid [0-9]+\) exited with status 1; terminating 1 other rank\(s\)"
  ;;

port_in_use)
  # Another program holds the master port: rank 0 cannot serve the store.
  free_port
  start_bg holder "$FP" --hold-port "$PORT"
  wait_for_line "$WORK/holder.out" "^holding $PORT\$"
  run launch -n 1 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$PORT" --timeout-ms 2000 \
    -- "$FP" --init
  expect_rc 1
  expect_faster_than 30000
  expect_rank_line err 0 "fault_probe: error: port $PORT already in use on 127.0.0.1"
  ;;

loopback_master_name)
  # Debian's /etc/hosts maps the host name to 127.0.1.1: a master started
  # with --master-addr $(hostname) would listen where no other node can
  # connect, and they would wait out their whole timeout. Rank 0 refuses at
  # once. A private /etc/hosts (user + mount namespace) makes the name.
  printf '127.0.0.1 localhost\n127.0.1.1 master-node.test\n' >"$WORK/hosts"
  # The probe mounts too: some sandboxes give the namespaces but no mounts in them.
  if ! unshare --user --map-root-user --mount sh -c "mount --bind '$WORK/hosts' /etc/hosts" 2>/dev/null; then
    echo "faults.$CASE skipped: no user and mount namespaces with mounts here (unshare)"
    exit 77
  fi
  cat >"$WORK/in_ns" <<EOS
#!/usr/bin/env bash
exec unshare --user --map-root-user --mount bash -c 'mount --bind "$WORK/hosts" /etc/hosts && exec "\$0" "\$@"' "$SP" "\$@"
EOS
  chmod +x "$WORK/in_ns"
  free_port
  SP=$WORK/in_ns run launch -n 1 --nnodes 2 --node-rank 0 --master-addr master-node.test --master-port "$PORT" \
    --timeout-ms 20000 -- "$FP" --init
  expect_rc 1
  expect_faster_than 15000
  expect_rank_line err 0 "fault_probe: error: cannot serve the rendezvous store on tcp://master-node.test:$PORT: 'master-node.test' resolves to 127.0.1.1 (loopback) on this machine, which no other node can reach; pass the master node's interface address (hostname -I), or 127.0.0.1 for a job on one node"
  ;;

unreachable_master)
  # Nobody listens at the master's port (refused), and an address that does
  # not answer at all: either way a one-line error after the timeout.
  free_port
  for addr in 127.0.0.1 10.255.255.1; do
    run launch -n 1 --nnodes 2 --node-rank 1 --master-addr $addr --master-port "$PORT" --timeout-ms 1500 \
      -- "$FP" --init
    expect_rc 1
    expect_faster_than 30000
    expect_line_re err "\[rank 1\] fault_probe: error: cannot reach master tcp://$addr:$PORT within 1500 ms: .*"
    expect_line_re err "shardplan launch: node 1 of 2: rank 1 \(pid [0-9]+\) exited with status 1"
  done
  ;;

comm_plugin_abi | comm_plugin_no_entry)
  # A backend found on SHARDPLAN_PLUGIN_PATH but built for another ABI, or
  # not a plugin at all: refused with its path, on every rank that gets to say so.
  if [[ $CASE == comm_plugin_abi ]]; then
    name=abiversion
    why="comm plugin ABI version [0-9]+, this shardplan expects [0-9]+ \(rebuild the plugin against this shardplan\)"
  else
    name=noentry
    why="not a shardplan plugin \(no 'shardplan_plugin_entry' entry point\)"
  fi
  SHARDPLAN_PLUGIN_PATH=$BIN/plugins run launch -n 2 --backend $name --timeout-ms 2000 -- "$FP" --init
  expect_rc 1
  expect_faster_than 30000
  expect_line_re err "\[rank [01]\] fault_probe: error: $BIN/plugins/libshardplan_comm_$name\.so: $why"
  [[ $(grep -c 'error:' "$WORK/err") -eq $(grep -cE -- "$why" "$WORK/err") ]] || fail "a rank printed another error"
  ;;

layer_plugin_abi | layer_plugin_no_entry)
  # A broken layer plugin in a folder the plan names under plugins:.
  if [[ $CASE == layer_plugin_abi ]]; then
    name=layerabi
    why="layer plugin ABI version 999, this shardplan expects [0-9]+ \(rebuild the plugin against this shardplan\)"
  else
    name=noentry
    why="not a shardplan plugin \(no 'shardplan_plugin_entry' entry point\)"
  fi
  dir=$BIN/faults/layer_$name
  train_with_plan_plugins "$dir" 1
  expect_line_re err "\[rank [01]\] train_model: error: $dir/libshardplan_layer_$name\.so: $why"
  ;;

plugin_search_path)
  # A working backend under a new name, in the current directory and on
  # LD_LIBRARY_PATH: not a place plugins are loaded from. The error lists
  # where they are (here only the install directory).
  cp "$INSTALL_PLUGINS/libshardplan_comm_gloo.so" "$WORK/libshardplan_comm_decoy.so"
  cd "$WORK" || fail "cd"
  LD_LIBRARY_PATH=$WORK run launch -n 2 --backend decoy --timeout-ms 5000 -- "$FP" --init
  expect_rc 1
  expect_line_re err "\[rank [01]\] fault_probe: error: no comm plugin 'decoy': libshardplan_comm_decoy\.so not found in \[$INSTALL_PLUGINS\] \(set SHARDPLAN_PLUGIN_PATH, or the plan's plugins: with SHARDPLAN_PLAN_PLUGINS=1\)"
  # On the configured search path it is found, and works.
  SHARDPLAN_PLUGIN_PATH=$WORK run launch -n 2 --backend decoy --timeout-ms 5000 -- "$FP" --init --collective all_reduce
  expect_rc 0
  expect_line out "[rank 0] rank 0: all_reduce done"
  expect_line out "[rank 1] rank 1: all_reduce done"
  ;;

plan_plugins_need_opt_in)
  # A plan is data: the folders under its plugins: are not searched (nothing
  # in them is loaded) unless the user opts in, and the refusal points at the
  # entry. The folder holds a broken plugin, so being loaded would show.
  dir=$BIN/faults/layer_layerabi
  train_with_plan_plugins "$dir" ""
  expect_line_re err "\[rank [01]\] train_model: error: $WORK/plan\.yaml:1:11: the plan names plugin directory '$dir', which is searched only with SHARDPLAN_PLAN_PLUGINS=1 \(plugins run code when loaded; or add it to SHARDPLAN_PLUGIN_PATH\)"
  grep -q "layer plugin ABI version" "$WORK/err" && fail "the plan's plugin was loaded"
  ;;

plan_plugins_missing_dir)
  # With the opt-in, a folder that does not exist is an error at its entry,
  # not silently skipped.
  train_with_plan_plugins "$WORK/nothere" 1
  expect_line_re err "\[rank [01]\] train_model: error: $WORK/plan\.yaml:1:11: plugin directory '$WORK/nothere' does not exist or is not a directory"
  ;;

plugin_by_path)
  # --backend names a plugin; a path (relative to the working directory or
  # absolute) is refused, even for a working library.
  cp "$INSTALL_PLUGINS/libshardplan_comm_gloo.so" "$WORK/libshardplan_comm_decoy.so"
  cd "$WORK" || fail "cd"
  for backend in ./libshardplan_comm_decoy.so "$WORK/libshardplan_comm_decoy.so"; do
    run launch -n 2 --backend "$backend" --timeout-ms 5000 -- "$FP" --init
    expect_rc 1
    expect_line_re err "\[rank [01]\] fault_probe: error: '${backend//./\\.}' is not a comm plugin name \(letters, digits, '_', '-', '\.'\): plugins are found by name in the plugin directories, never by path; put the library's folder in SHARDPLAN_PLUGIN_PATH"
    grep -q "joined" "$WORK/out" && fail "a rank joined with backend $backend"
  done
  ;;

plugin_exits_on_load)
  # A backend whose static initialiser calls exit(0): the ranks fail, naming
  # it, and so does the job.
  SHARDPLAN_PLUGIN_PATH=$BIN/plugins run launch -n 2 --backend exits --timeout-ms 5000 -- "$FP" --init
  expect_rc 1
  expect_faster_than 30000
  expect_line_re err "\[rank [01]\] shardplan: plugin $BIN/plugins/libshardplan_comm_exits\.so called exit\(\) while being loaded; the process fails with status 1"
  ;;

world_size_mismatch)
  # Two ranks started by hand (as torchrun-style environments would) with
  # different WORLD_SIZE: both say so in one line naming both sizes, instead
  # of failing inside gloo's rendezvous.
  common=(SHARDPLAN_BACKEND=gloo "SHARDPLAN_STORE=file://$WORK/store" SHARDPLAN_TIMEOUT_MS=5000)
  start_bg r0 env "${common[@]}" RANK=0 WORLD_SIZE=2 "$FP" --init
  r0=$BG
  start_bg r1 env "${common[@]}" RANK=1 WORLD_SIZE=3 "$FP" --init
  r1=$BG
  why="rank 0 was started with world size 2 but rank 1 with world size 3: every rank must be started with the same WORLD_SIZE"
  for r in 0 1; do
    pid=r$r
    wait_bg "${!pid}" 30000
    ((RC != 0)) || fail "rank $r exited with status 0"
    grep -Fqx "fault_probe: error: $why" "$WORK/r$r.err" || fail "rank $r: $(cat "$WORK/r$r.err")"
  done
  ;;

*)
  fail "unknown case"
  ;;
esac
echo "PASS [$CASE] (${ELAPSED_MS:-0} ms)"
