#!/usr/bin/env bash
# Issue 22's overlap figures on a real shaped link: bench_dp_step with the
# data axis across two test hosts (network namespaces joined by veth, each
# direction of each host's cable shaped by tc tbf; tests/hosts/netns.sh),
# next to the same run on one host with the gloo plugin's emulated link
# (SHARDPLAN_GLOO_LINK_GBPS, a pacing of each operation; docs/BENCHMARKS.md).
# On the test hosts each host runs one launcher: {data: 2} is one rank per
# host, {data: 2, model: 2} two, the model axis within a host (shared
# memory) and the data axis across the cable (gloo's TCP). Needs root.
#
#   benchmarks/dp_step/real_link.sh [BUILD_DIR] [-- bench_dp_step options]
#
# REAL_LINK_RUNS="GBPS:BATCH ..." picks the links and their global batch
# (default "2:16 1:32", as the emulated-link runs of 2026-11-26: a batch
# whose backward is longer than the sync); REAL_LINK_KINDS="real emulated"
# picks which runs to make. Prints each run's bench output, then one table.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
if [[ $# -gt 0 && "$1" != -* ]]; then BUILD=$1; shift; fi
[[ "${1:-}" == "--" ]] && shift
EXTRA=(--bucket-mb 1 --rounds 15 --steps 1 "$@")
CLI="$BUILD/bin/shardplan"
BENCH="$BUILD/bin/bench_dp_step"
for f in "$CLI" "$BENCH"; do
  [[ -x "$f" ]] || { echo "real_link.sh: $f is missing; build it: scripts/build.sh shardplan_cli bench_dp_step" >&2; exit 2; }
done
. tests/hosts/netns.sh
hosts_require
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT SHARDPLAN_STORE SHARDPLAN_LOCAL_ADDR \
  SHARDPLAN_GLOO_LINK_GBPS SHARDPLAN_GLOO_SHM
OUT=$(mktemp -d "${TMPDIR:-/tmp}/real-link.XXXXXX")
trap 'hosts_down; rm -rf "$OUT"' EXIT
MESHES=("1 plans/data_parallel.yaml" "2 plans/gpt_2d.yaml")
ROWS=()

# row KIND GBPS BATCH LOG LINK LOAD SHARING: one table row from a bench output.
# SHARING ranks send their data-axis bytes through one cable (the ranks of a
# host; 1 for the emulation, which paces each rank alone): the sync's floor
# is their ring minimum over the rate.
row() {
  awk -v kind="$1" -v gbps="$2" -v batch="$3" -v link="$5" -v load="$6" -v sharing="$7" '
    $1 == "bench_dp_step:" && match($0, /mesh \{[^}]*\}/) { mesh = substr($0, RSTART + 5, RLENGTH - 5) }
    $1 ~ /^(on|off|none|zero)$/ && NF == 7 { step[$1] = $2; wait[$1] = $4 }
    /^hidden fraction/ { split($0, h, ": "); split(h[2], v, " "); med = v[1]; paired = v[5] }
    /^finish\(\) wait/ { removed = $6; cpu_off = $(NF - 4); cpu_on = $(NF - 1) }
    /measured on the sockets \(.on. - .none.\)/ { for (i = 1; i <= NF; i++) if ($i == "x") ratio = $(i - 1) }
    match($0, /minimum 2\(D-1\)\/D x gradients [0-9]+/) { split(substr($0, RSTART, RLENGTH), m, " "); ringmin = m[5] }
    END {
      floor = ringmin * sharing * 8 / (gbps * 1e9) * 1000
      printf "| %s | %s Gbit/s, %s | `%s` | %s | %s | %s | %.2f | **%s / %s** | %s → %s (%s) | %.2f ÷ %.2f = **%.3f** | %s / %s | %s | %s | %s |\n", kind, gbps,
        batch, mesh, step["on"], step["off"], step["none"], step["off"] - step["none"], med, paired, wait["off"], wait["on"],
        removed, wait["off"], floor, (floor > 0 ? wait["off"] / floor : 0), cpu_off, cpu_on,
        ratio + 0 < 0.01 ? "(no sockets)" : ratio, link, load
    }' "$4"
}
load1() { cut -d' ' -f1 /proc/loadavg; }

run_real() {  # run_real GBPS BATCH
  local gbps=$1 batch=$2 spec n plan log before after load
  hosts_up 2 $((gbps * 1000)) || { echo "real_link.sh: cannot make the test hosts" >&2; exit 1; }
  for spec in "${MESHES[@]}"; do
    read -r n plan <<<"$spec"
    log="$OUT/real-$gbps-$n.log"
    before=$(host_exec 1 cat /sys/class/net/eth0/statistics/tx_bytes)
    load=$(load1)
    echo
    echo "\$ [host 0 and host 1, tbf ${gbps} Gbit/s] $CLI launch -n $n --nnodes 2 --node-rank K --master-addr $(host_addr 0) --local-addr <host K> -- $BENCH --plan $plan --batch $batch ${EXTRA[*]}"
    TWO_NODES_ADDRS="$(host_addr 0) $(host_addr 1)" TWO_NODES_EXEC_0="ip netns exec $(hosts_ns 0)" \
      TWO_NODES_EXEC_1="ip netns exec $(hosts_ns 1)" TWO_NODES_TIMEOUT_S=600 \
      bash tests/launcher/two_nodes.sh "$CLI" "$n" 29500 --backend gloo --timeout-ms 120000 \
      -- "$BENCH" --plan "$plan" --batch "$batch" "${EXTRA[@]}" >"$log.all" 2>&1
    local rc=$?
    sed -n 's/^\[rank 0\] //p' "$log.all" | tee "$log"
    ((rc == 0)) || { echo "real_link.sh: the run failed:" >&2; tail -20 "$log.all" >&2; exit 1; }
    after=$(host_exec 1 cat /sys/class/net/eth0/statistics/tx_bytes)
    ROWS+=("$(row "tbf" "$gbps" "$batch" "$log" "$(awk -v b=$((after - before)) 'BEGIN { printf "%.1f MB", b / 1e6 }')" "$load" "$n")")
  done
  hosts_down
}

run_emulated() {  # run_emulated GBPS BATCH: one host, gloo's shared memory, the emulated link
  local gbps=$1 batch=$2 spec n plan log load
  for spec in "${MESHES[@]}"; do
    read -r n plan <<<"$spec"
    log="$OUT/emulated-$gbps-$n.log"
    load=$(load1)
    echo
    echo "\$ SHARDPLAN_GLOO_LINK_GBPS=$gbps $CLI launch -n $((2 * n)) --backend gloo -- $BENCH --plan $plan --batch $batch ${EXTRA[*]}"
    SHARDPLAN_GLOO_LINK_GBPS=$gbps "$CLI" launch -n $((2 * n)) --backend gloo --timeout-ms 120000 \
      -- "$BENCH" --plan "$plan" --batch "$batch" "${EXTRA[@]}" >"$log.all" 2>&1 ||
      { echo "real_link.sh: the run failed:" >&2; tail -20 "$log.all" >&2; exit 1; }
    sed -n 's/^\[rank 0\] //p' "$log.all" | tee "$log"
    ROWS+=("$(row "link_gbps" "$gbps" "$batch" "$log" "—" "$load" 1)")
  done
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git rev-parse --short HEAD 2>/dev/null)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for spec in ${REAL_LINK_RUNS:-2:16 1:32}; do
  gbps=${spec%%:*} batch=${spec#*:}
  [[ $gbps =~ ^[1-9][0-9]*$ && $batch =~ ^[1-9][0-9]*$ ]] ||
    { echo "real_link.sh: REAL_LINK_RUNS entry '$spec' is not GBPS:BATCH (whole numbers)" >&2; exit 2; }
  for kind in ${REAL_LINK_KINDS:-real emulated}; do
    case $kind in
      real) run_real "$gbps" "$batch" ;;
      emulated) run_emulated "$gbps" "$batch" ;;
      *) echo "real_link.sh: REAL_LINK_KINDS entry '$kind' is neither real nor emulated" >&2; exit 2 ;;
    esac
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| link | rate, batch | mesh | on | off | none | off − none | hidden (medians / paired) | wait off → on (removed) | sync (wait off) ÷ ring bytes / rate, ms | sync CPU off / on | socket bytes ÷ ring minimum | host 1 sent over its cable | load |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
