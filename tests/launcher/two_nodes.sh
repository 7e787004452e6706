#!/usr/bin/env bash
# Runs one job as two "nodes" on this machine: two `shardplan launch`
# processes with --nnodes 2, node 0 binding 127.0.0.1 and node 1 127.0.0.2
# (both loopback on Linux), meeting at tcp://127.0.0.1:<port>.
#
# usage: two_nodes.sh <shardplan> <nproc_per_node> <port> [launch options...] -- prog args...
#   launch options (e.g. --backend gloo --timeout-ms 60000) go to both launchers.
#
# Exits 0 when both launchers exit 0. When one fails, the other is stopped
# (SIGTERM, which it forwards to its ranks; SIGKILL if it lingers) and the
# script exits 1. A job running longer than $TWO_NODES_TIMEOUT_S (default 300)
# is stopped the same way, so a test never hangs on a rendezvous.
#
# The test hosts of tests/hosts/two_hosts.sh put the nodes on separate hosts:
#   TWO_NODES_ADDRS="A0 A1"   the nodes' addresses (node 0's is the master's)
#   TWO_NODES_EXEC_0/1        a command prefix that runs node K on its host
set -u

usage() {
  echo "usage: two_nodes.sh <shardplan> <nproc_per_node> <port> [launch options...] -- prog args..." >&2
  exit 2
}
[[ $# -ge 5 ]] || usage
shardplan=$1 nproc=$2 port=$3
shift 3
opts=()
while [[ $# -gt 0 && $1 != -- ]]; do
  opts+=("$1")
  shift
done
[[ $# -ge 2 ]] || usage
shift  # the --
timeout_s=${TWO_NODES_TIMEOUT_S:-300}
read -r -a addrs <<<"${TWO_NODES_ADDRS:-127.0.0.1 127.0.0.2}"

pids=()
start_node() {
  local node=$1 addr=$2 exec_var=TWO_NODES_EXEC_$1
  shift 2
  ${!exec_var:-} "$shardplan" launch -n "$nproc" --nnodes 2 --node-rank "$node" --master-addr "${addrs[0]}" \
    --master-port "$port" --local-addr "$addr" ${opts[@]+"${opts[@]}"} -- "$@" &
  pids[node]=$!
}

rcs=("" "")
stop_node() {
  local node=$1 i
  [[ -n ${rcs[node]} ]] && return
  kill -TERM "${pids[node]}" 2>/dev/null
  # The launcher's own grace period is 5 s; allow for it before SIGKILL.
  for ((i = 0; i < 150; i++)); do
    kill -0 "${pids[node]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "${pids[node]}" 2>/dev/null
  wait "${pids[node]}"
  rcs[node]=$?
}
on_signal() {
  stop_node 0
  stop_node 1
  exit 1
}
trap on_signal INT TERM HUP

start_node 0 "${addrs[0]}" "$@"
start_node 1 "${addrs[1]}" "$@"

deadline=$((SECONDS + timeout_s))
failed=""
while [[ -z ${rcs[0]} || -z ${rcs[1]} ]]; do
  for node in 0 1; do
    if [[ -z ${rcs[node]} ]] && ! kill -0 "${pids[node]}" 2>/dev/null; then
      wait "${pids[node]}"
      rcs[node]=$?
      if [[ ${rcs[node]} -ne 0 && -z $failed ]]; then
        failed=$node
        other=$((1 - node))
        if [[ -z ${rcs[other]} ]]; then
          echo "two_nodes.sh: node $node's launcher exited with status ${rcs[node]}; stopping node $other" >&2
          stop_node "$other"
        fi
      fi
    fi
  done
  if [[ (-z ${rcs[0]} || -z ${rcs[1]}) && $SECONDS -ge $deadline ]]; then
    echo "two_nodes.sh: job still running after ${timeout_s} s; stopping both nodes" >&2
    stop_node 0
    stop_node 1
    exit 1
  fi
  sleep 0.1
done
if [[ ${rcs[0]} -ne 0 || ${rcs[1]} -ne 0 ]]; then
  echo "two_nodes.sh: launcher exit statuses: node 0 ${rcs[0]}, node 1 ${rcs[1]}" >&2
  exit 1
fi
exit 0
