#!/usr/bin/env bash
# e2e_test.sh SHARDPLAN TRAIN_MODEL PLAN: the GPT trained by 2 ranks on each of
# two test hosts (tests/hosts/two_hosts.sh) gives the losses of one process,
# float64, to the printed precision. Exits 77 where namespaces cannot be made.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns.sh"
hosts_require
SP=$1 TRAIN=$2 PLAN=$3
run=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --steps 8)
exec bash "$HERE/../e2e/losses_match.sh" 1e-7 -- "${run[@]}" \
  -- bash "$HERE/two_hosts.sh" "$SP" 2 --backend gloo --timeout-ms 30000 -- "${run[@]}" --plan "$PLAN"
