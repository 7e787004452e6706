#!/usr/bin/env bash
# e2e_test.sh SHARDPLAN TRAIN_MODEL PLAN: the GPT trained by 2 ranks on each of
# two test hosts (tests/hosts/two_hosts.sh) gives the losses of one process,
# float64, to the printed precision. Exits 77 where namespaces cannot be made.
# Also checks the transport each group took (SHARDPLAN_GLOO_VERBOSE=1): a
# group within one host (world ranks 0,1 or 2,3: gpt_2d.yaml's model axis)
# shares memory, a group across the hosts (gpt_2d's data axis, 0,2 and 1,3;
# the world; gpt.yaml's model axis over all four) goes over TCP.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns.sh"
hosts_require
SP=$1 TRAIN=$2 PLAN=$3
LOG=$(mktemp "${TMPDIR:-/tmp}/hosts-e2e.XXXXXX")
trap 'rm -f "$LOG"' EXIT
run=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --steps 8)
job=(bash "$HERE/two_hosts.sh" "$SP" 2 --backend gloo --timeout-ms 30000 -- "${run[@]}" --plan "$PLAN")
SHARDPLAN_GLOO_VERBOSE=1 bash "$HERE/../e2e/losses_match.sh" 1e-7 -- "${run[@]}" \
  -- bash -c 'set -o pipefail; "$@" 2>&1 | tee "$0"' "$LOG" "${job[@]}" || exit 1

# "[rank R] gloo: rank r of n (world ranks A,B,...): shared memory|tcp, hosts ..."
transports=$(sed -nE 's/^\[rank [0-9]+\] gloo: rank [0-9]+ of [0-9]+ \(world ranks ([0-9,]+)\): (shared memory|tcp).*/\1 \2/p' "$LOG" | sort | uniq -c)
echo "transports (lines, world ranks, transport):"
echo "$transports"
bad=$(awk '{ within = ($2 == "0,1" || $2 == "2,3"); shm = ($3 == "shared") }
  within != shm { print "world ranks " $2 ": " $3 ($3 == "shared" ? " memory" : "") }' <<<"$transports")
[[ -z $bad ]] || { echo "FAIL: wrong transport: $bad (within a host: shared memory; across: tcp)" >&2; exit 1; }
grep -q ' 0,1,2,3 tcp$' <<<"$transports" || { echo "FAIL: no tcp line for the world (0,1,2,3)" >&2; exit 1; }
if [[ $(basename "$PLAN") == gpt_2d.yaml ]]; then
  for g in "0,1 shared memory" "2,3 shared memory" "0,2 tcp" "1,3 tcp"; do
    grep -Eq "^ +[0-9]+ $g\$" <<<"$transports" || { echo "FAIL: expected world ranks ${g%% *} on ${g#* }" >&2; exit 1; }
  done
fi
echo "transports as expected"
