#!/usr/bin/env bash
# The main demo: a GPT-style language model (examples/models/gpt.h) trained
# with tensor parallelism on two ranks (threads on the in-process backend)
# from plans/gpt.yaml, on the byte-level corpus in examples/data; then it
# generates three samples of 40 bytes with the sharded model.
# Extra arguments go to train_gpt (e.g. --steps 100, --ranks 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
bash scripts/build.sh shardplan_plugins train_gpt
BIN="${SHARDPLAN_BUILD_DIR:-build}/examples"
echo "== GPT, 2 ranks, plans/gpt.yaml =="
"$BIN/train_gpt" --plan plans/gpt.yaml --ranks 2 --report --generate 40 "$@"
