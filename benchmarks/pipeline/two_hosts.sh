#!/usr/bin/env bash
# Issue 36: a pipeline across two hosts against data parallelism across
# them, tensor parallelism inside each host in both: 4 gloo ranks, 2 per test
# host (network namespaces joined by veth, each direction of each host's
# cable shaped by tc tbf; tests/hosts/netns.sh), the same GPT and global
# batch. {pipe: 2, model: 2} (plans/gpt_pipe_2d.yaml: stage 0 on host 0,
# stage 1 on host 1; only activations and their gradients cross the cable)
# against {data: 2, model: 2} (plans/gpt_2d.yaml: every gradient is
# all-reduced across it). bench_pipeline times both alike (forward, backward,
# the gradients' average for the data axis; no optimizer step). Needs root.
#
#   benchmarks/pipeline/two_hosts.sh [BUILD_DIR] [-- bench_pipeline options]
#
# TWO_HOSTS_GBPS="1 2" picks the links; TWO_HOSTS_BATCH (default 16) the
# global batch. Prints each run's bench output, then one table: the median
# step of the slowest rank, and the bytes host 1 sent and received over its
# cable during the run (set-up and the warm-up step included) per step.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
if [[ $# -gt 0 && "$1" != -* ]]; then BUILD=$1; shift; fi
[[ "${1:-}" == "--" ]] && shift
STEPS=${TWO_HOSTS_STEPS:-7}
BATCH=${TWO_HOSTS_BATCH:-16}
EXTRA=(--batch "$BATCH" --steps "$STEPS" --config "${TWO_HOSTS_CONFIG:-context=64,embed=256,heads=4,layers=4,mlp=1024}" "$@")
CLI="$BUILD/bin/shardplan"
BENCH="$BUILD/bin/bench_pipeline"
for f in "$CLI" "$BENCH"; do
  [[ -x "$f" ]] || { echo "two_hosts.sh: $f is missing; build it: cmake --build $BUILD --target shardplan_cli bench_pipeline" >&2; exit 2; }
done
. tests/hosts/netns.sh
hosts_require
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR \
  SHARDPLAN_GLOO_LINK_GBPS SHARDPLAN_GLOO_SHM
OUT=$(mktemp -d "${TMPDIR:-/tmp}/two-hosts.XXXXXX")
trap 'hosts_down; rm -rf "$OUT"' EXIT
PLANS=("pipe plans/gpt_pipe_2d.yaml" "data plans/gpt_2d.yaml")
ROWS=()
counter() { host_exec 1 cat /sys/class/net/eth0/statistics/"$1"; }

run_link() {  # run_link GBPS
  local gbps=$1 spec kind plan log tx rx
  hosts_up 2 $((gbps * 1000)) || { echo "two_hosts.sh: cannot make the test hosts" >&2; exit 1; }
  for spec in "${PLANS[@]}"; do
    read -r kind plan <<<"$spec"
    log="$OUT/$kind-$gbps.log"
    tx=$(counter tx_bytes) rx=$(counter rx_bytes)
    echo
    echo "\$ [host 0 and host 1, tbf ${gbps} Gbit/s] $CLI launch -n 2 --nnodes 2 --node-rank K -- $BENCH --plan $plan ${EXTRA[*]}"
    TWO_NODES_ADDRS="$(host_addr 0) $(host_addr 1)" TWO_NODES_EXEC_0="ip netns exec $(hosts_ns 0)" \
      TWO_NODES_EXEC_1="ip netns exec $(hosts_ns 1)" TWO_NODES_TIMEOUT_S=600 \
      bash tests/launcher/two_nodes.sh "$CLI" 2 29500 --backend gloo --timeout-ms 120000 \
      -- "$BENCH" --plan "$plan" "${EXTRA[@]}" >"$log.all" 2>&1
    local rc=$?
    sed -n 's/^\[rank 0\] //p' "$log.all" | tee "$log"
    ((rc == 0)) || { echo "two_hosts.sh: the run failed:" >&2; tail -20 "$log.all" >&2; exit 1; }
    local bytes=$(($(counter tx_bytes) - tx + $(counter rx_bytes) - rx))
    local step
    step=$(awk '$1 == "data" || $1 ~ /^(gpipe|1f1b|interleaved)$/ { print $5 }' "$log")
    ROWS+=("| ${gbps} Gbit/s | \`$(grep -m1 '^mesh' "$plan")\` | $step | $(awk -v b="$bytes" -v s="$STEPS" 'BEGIN { printf "%.2f", b / (s + 1) / 1e6 }') | $(cut -d' ' -f1 /proc/loadavg) |")
  done
  hosts_down
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git rev-parse --short HEAD 2>/dev/null)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for gbps in ${TWO_HOSTS_GBPS:-1 2}; do
  [[ $gbps =~ ^[1-9][0-9]*$ ]] || { echo "two_hosts.sh: TWO_HOSTS_GBPS entry '$gbps' is not a whole number" >&2; exit 2; }
  run_link "$gbps"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| link | mesh | step ms (median, slowest rank) | MB over host 1's cable per step (both ways) | load |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
