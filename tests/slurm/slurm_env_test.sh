#!/usr/bin/env bash
# The library under Slurm's environment, exactly as Slurm 22.05 sets it for
# the tasks of an srun step (srun(1), "OUTPUT ENVIRONMENT VARIABLES"; the
# lists below were also read from a real slurm-wlm 22.05, srun -N1 -n2 etc.,
# 2026-11-27). No Slurm runs here: each task is fault_probe started with its
# variables, meeting the others over gloo at MASTER_ADDR/MASTER_PORT as
# docs/SLURM.md tells users to set them.
#   slurm_env_test.sh <fault_probe> <launcher_probe> <case>
# Cases:
#   srun_n2            srun -N1 -n2: no SLURM_NTASKS_PER_NODE; the ranks on
#                      the node come from SLURM_TASKS_PER_NODE=2
#   ntasks_per_node    srun --ntasks-per-node 2: SLURM_NTASKS_PER_NODE=2 too
#   cpus_per_task      srun -n1 -c1 on 2 cores: 1 thread (SLURM_CPUS_PER_TASK)
#   two_nodes          srun -N2 -n3 (both "nodes" here): SLURM_TASKS_PER_NODE=2,1
#                      indexed by SLURM_NODEID; the lone rank of node 1 takes
#                      both cores
#   batch_script       sbatch -n 2's batch script run as if it were a rank: one
#                      line saying to use srun, not a 300 s wait
#   mpi_without_pmix   SHARDPLAN_BACKEND=mpi under srun without --mpi=pmix:
#                      one line saying what to do
set -u
PROBE=$1 FREE_PORT=$2 CASE=$3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/slurm-env-test.XXXXXX")
TEST_NAME=$CASE
# shellcheck source=../launcher/test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../launcher/test_lib.sh"  # BG_PIDS, cleanup
set -f  # the values are passed unquoted, and n[1-2] is not a pattern
fail() {
  echo "FAIL [$CASE]: $*" >&2
  for f in "$WORK"/task*; do [[ -e $f ]] && { echo "--- $(basename "$f"):"; cat "$f"; } >&2; done
  exit 1
}

# step_env NTASKS NNODES TASKS_PER_NODE NODEID PROCID LOCALID GTIDS CPUS_ON_NODE JOB_CPUS_PER_NODE [EXTRA...]:
# one task's variables as srun sets them (job 4242, step 0, nodes n[1-NNODES]).
step_env() {
  local nodelist=n1
  (($2 > 1)) && nodelist="n[1-$2]"
  printf '%s\n' SLURM_CLUSTER_NAME=cluster SLURM_CONF=/etc/slurm/slurm.conf SLURM_CPUS_ON_NODE="$8" \
    SLURM_GTIDS="$7" SLURM_JOBID=4242 SLURM_JOB_CPUS_PER_NODE="$9" SLURM_JOB_GID=1000 SLURM_JOB_ID=4242 \
    SLURM_JOB_NAME=train SLURM_JOB_NODELIST="$nodelist" SLURM_JOB_NUM_NODES="$2" SLURM_JOB_PARTITION=debug \
    SLURM_JOB_UID=1000 SLURM_JOB_USER=user SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 SLURM_LOCALID="$6" \
    SLURM_NNODES="$2" SLURM_NODEID="$4" SLURM_NODELIST="$nodelist" SLURM_NPROCS="$1" SLURM_NTASKS="$1" \
    SLURM_PRIO_PROCESS=0 SLURM_PROCID="$5" SLURM_SRUN_COMM_HOST=127.0.0.1 SLURM_SRUN_COMM_PORT=60088 \
    SLURM_STEPID=0 SLURM_STEP_ID=0 SLURM_STEP_LAUNCHER_PORT=60088 SLURM_STEP_NODELIST="$nodelist" \
    SLURM_STEP_NUM_NODES="$2" SLURM_STEP_NUM_TASKS="$1" SLURM_STEP_TASKS_PER_NODE="$3" SLURM_SUBMIT_DIR=/home/user \
    SLURM_SUBMIT_HOST=login SLURM_TASKS_PER_NODE="$3" SLURM_TASK_PID=$((20000 + $5)) SLURMD_NODENAME="n$(($4 + 1))" \
    SLURM_TOPOLOGY_ADDR="n$(($4 + 1))" SLURM_TOPOLOGY_ADDR_PATTERN=node SLURM_UMASK=0022 \
    SLURM_WORKING_CLUSTER=cluster:127.0.0.1:6817:9728:109
  shift 9
  (($# > 0)) && printf '%s\n' "$@"
}

# task K VARS...: fault_probe --init --describe as task K with exactly
# VARS (plus what a user adds: MASTER_ADDR/MASTER_PORT, and a timeout so a
# failure here cannot hang), on cores 0 and 1; output in $WORK/taskK.
PORT=$("$FREE_PORT" --free-port) || fail "no free port"
task() {
  local k=$1
  shift
  env -i PATH="$PATH" HOME="${HOME:-/}" "$@" MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
    SHARDPLAN_TIMEOUT_MS=20000 timeout -k 5 60 taskset -c 0,1 "$PROBE" --init --describe >"$WORK/task$k" 2>&1 &
  BG_PIDS+=($!)
}
wait_all() {
  local p rc=0
  for p in "${BG_PIDS[@]}"; do wait "$p" || rc=$?; done
  BG_PIDS=()
  return $rc
}
# expect K LINE: task K printed LINE.
expect() { grep -qxF -- "$2" "$WORK/task$1" || fail "task $1 did not print '$2'"; }

case $CASE in
srun_n2 | ntasks_per_node)
  extra=()
  [[ $CASE == ntasks_per_node ]] && extra=(SLURM_NTASKS_PER_NODE=2)
  for r in 0 1; do task $r $(step_env 2 1 2 0 $r $r 0,1 2 2 ${extra[@]+"${extra[@]}"}); done
  wait_all || fail "a task failed"
  for r in 0 1; do
    expect $r "rank $r joined"
    grep -Eqx "rank $r of 2, local $r of 2, threads 1 per rank \(.*2 ranks on 2 cores, default\)" "$WORK/task$r" ||
      fail "task $r: not rank $r of 2 with 2 ranks on the node and 1 thread"
  done
  ;;
cpus_per_task)
  task 0 $(step_env 1 1 1 0 0 0 0 1 1 SLURM_CPUS_PER_TASK=1)
  wait_all || fail "the task failed"
  grep -Eqx "rank 0 of 1, local 0 of 1, threads 1 per rank \(.*1 rank on 2 cores, SLURM_CPUS_PER_TASK\)" "$WORK/task0" ||
    fail "not 1 thread from SLURM_CPUS_PER_TASK=1"
  ;;
two_nodes)
  task 0 $(step_env 3 2 2,1 0 0 0 0,1 2 '2(x2)')
  task 1 $(step_env 3 2 2,1 0 1 1 0,1 2 '2(x2)')
  task 2 $(step_env 3 2 2,1 1 2 0 2 2 '2(x2)')
  wait_all || fail "a task failed"
  for r in 0 1; do
    grep -Eqx "rank $r of 3, local $r of 2, threads 1 per rank \(.*2 ranks on 2 cores, default\)" "$WORK/task$r" ||
      fail "task $r: not one of node 0's 2 ranks with 1 thread"
  done
  grep -Eqx "rank 2 of 3, local 0 of 1, threads 2 per rank \(.*1 rank on 2 cores, default\)" "$WORK/task2" ||
    fail "task 2: not node 1's only rank with 2 threads"
  ;;
batch_script)
  # What sbatch -n 2 gives its batch script (read from a real sbatch): no step.
  task 0 SLURM_CPUS_ON_NODE=2 SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NPROCS=2 \
    SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_TASKS_PER_NODE=2 SLURM_JOB_NUM_NODES=1 SLURM_NNODES=1
  wait_all && fail "the batch script was taken for a rank"
  expect 0 "fault_probe: error: SLURM_NTASKS=2, but this process is not a task of an srun step (it is job 4242's batch script): start the ranks with srun (docs/SLURM.md)"
  ;;
mpi_without_pmix)
  task 0 $(step_env 1 1 1 0 0 0 0 2 2 SHARDPLAN_BACKEND=mpi)
  wait_all && fail "the task did not stop"
  expect 0 "fault_probe: error: backend 'mpi' under srun needs Slurm's PMIx: run srun --mpi=pmix (this task has SLURM_PROCID but no PMIX_RANK, so Open MPI cannot find its peers), or use backend gloo with MASTER_ADDR and MASTER_PORT (docs/SLURM.md)"
  [[ $(wc -l <"$WORK/task0") -eq 1 ]] || fail "more than the one line"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS [$CASE]"
