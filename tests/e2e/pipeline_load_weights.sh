#!/usr/bin/env bash
# A pipelined Llama fine-tuned from weights on disk: train_model
# --save-weights writes config.json + safetensors, and --load-weights loads
# them into {pipe: 2} (2 ranks) and {data: 2, pipe: 2, model: 2} (8 ranks,
# tied head) pipelines, whose losses must be the unpipelined run's from the
# same file (float64, 1e-10).
# usage: pipeline_load_weights.sh TRAIN_MODEL PLANS_DIR WORK_DIR LOSSES_MATCH
set -uo pipefail
train=$1 plans=$2 work=$3 match=$4
rm -rf "$work" && mkdir -p "$work"
failures=0
for tie in 0 1; do
  "$train" --model llama --config context=16,embed=32,layers=2,tie=$tie --steps 1 --batch 4 --dtype float64 \
    --save-weights "$work/w$tie" >"$work/save.txt" 2>&1 || { cat "$work/save.txt"; exit 1; }
  run=("$train" --model llama --dtype float64 --steps 3 --log-every 1 --batch 8 --load-weights "$work/w$tie")
  for plan in llama_pipe.yaml:2 llama_pipe_3d.yaml:8; do
    if "$match" 1e-10 -- "${run[@]}" -- "${run[@]}" --ranks "${plan#*:}" --plan "$plans/${plan%:*}" >"$work/m.txt" 2>&1; then
      echo "ok   tie $tie ${plan%:*}: the unpipelined run's losses from the same weights"
    else
      cat "$work/m.txt"
      echo "FAIL tie $tie ${plan%:*}"
      failures=$((failures + 1))
    fi
  done
done
exit $failures
