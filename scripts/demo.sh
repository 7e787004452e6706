#!/usr/bin/env bash
# The main demo: tensor-parallel training of the example MLP on two ranks
# (threads on the in-process backend), next to the same model unsharded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
bash scripts/build.sh shardplan_plugins train_mlp
BIN="${SHARDPLAN_BUILD_DIR:-build}/examples"
echo "== 2 ranks, plans/mlp.yaml =="
"$BIN/train_mlp" --plan plans/mlp.yaml --ranks 2 --report "$@"
echo "== 1 rank, unsharded (the losses above must match these) =="
"$BIN/train_mlp" "$@"
