#!/usr/bin/env bash
# Issue 10's data-parallel benchmark in one invocation: bench_dp_step on
# {data: 2} (2 gloo processes) and {data: 2, model: 2} (4 gloo processes),
# each with overlap on / off / no sync / ZeRO-1 interleaved, with the date,
# the machine and its load before and after (docs/BENCHMARKS.md).
#
#   benchmarks/dp_step/run.sh [BUILD_DIR] [-- bench_dp_step options, e.g. --rounds 3]
#
# SHARDPLAN_GLOO_LINK_GBPS=X runs it over an emulated X Gbit/s link (the
# sync of two hosts; docs/BENCHMARKS.md), SHARDPLAN_GLOO_SHM=off over TCP.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
if [[ $# -gt 0 && "$1" != -* ]]; then BUILD=$1; shift; fi
[[ "${1:-}" == "--" ]] && shift
# 1 MiB buckets: the plans' default 25 MiB makes the example's 12.6 MiB of
# gradients one bucket, which starts when backward ends. Later options win.
EXTRA=(--bucket-mb 1 "$@")
CLI="$BUILD/bin/shardplan"
BENCH="$BUILD/bin/bench_dp_step"
for f in "$CLI" "$BENCH"; do
  [[ -x "$f" ]] || { echo "run.sh: $f is missing; build it: scripts/build.sh shardplan_cli bench_dp_step" >&2; exit 2; }
done
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in "2 plans/data_parallel.yaml" "4 plans/gpt_2d.yaml"; do
  read -r n plan <<<"$run"
  echo
  echo "\$ $CLI launch -n $n --backend gloo -- $BENCH --plan $plan ${EXTRA[*]}"
  "$CLI" launch -n "$n" --backend gloo -- "$BENCH" --plan "$plan" "${EXTRA[@]}" 2>&1 | sed 's/^\[rank 0\] //'
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
