#!/usr/bin/env bash
# Weights from PyTorch into the Llama example, checked against an independent
# PyTorch Llama (tests/llama/reference.py: its own forward; safetensors by
# tests/weights/interop.py, apart from the C++ code). Python writes random
# weights (float32, and the same in bfloat16) with a config.json;
# train_model --load-weights DIR (the shape from config.json alone) --steps 0
# generates greedily in float64 from the bfloat16 file at 2 thread ranks, with
# 2 kv heads and 1: the text must be Python's (the float32 file's logits at 1,
# 2 and 4 ranks, threads and gloo processes: tests/e2e/llama_logits.sh).
# Then a fine-tune of 10 steps under {data: 2, model: 2} with sequence
# parallelism saves --save-weights, and from that file Python's greedy text
# must be what C++ generates and Python's float64 logits C++'s to 1e-10.
# usage: llama_weights.sh TRAIN_MODEL PLANS_DIR PLAN_2D WORK_DIR
set -uo pipefail
train=$1 plans=$2 plan_2d=$3 work=$4
. "$(dirname "$0")/llama_common.sh"
rm -rf "$work" && mkdir -p "$work"

for kv in 2 1; do
  d=$work/kv$kv
  $py "$ref" write "$d" num_key_value_heads=$kv || exit 1
  want=$($py "$ref" greedy "$d/bf16" "$prompt" $n)
  check "kv_heads $kv, bfloat16 file, 2 ranks" "$want" \
    "$(gen --load-weights "$d/bf16/model.safetensors" --ranks 2 --plan "$plans/llama.yaml")"
done

# Names that differ: the file's "base.model.*" mapped back by --rename-weights;
# a tensor the model lacks is an error naming it, a warning with
# --lenient-weights.
want=$($py "$ref" greedy "$work/kv2" "$prompt" $n)
$py - "$(dirname "$ref")/../weights" "$work/kv2/model.safetensors" "$work" <<'PY' || exit 1
import os, sys, torch
sys.path.insert(0, sys.argv[1])
from interop import read_safetensors, write_safetensors
tensors = read_safetensors(sys.argv[2])
for sub, named in (("renamed", {"base." + k: v for k, v in tensors.items()}),
                   ("extra", dict(tensors, **{"extra.bias": torch.zeros(3)}))):
    os.makedirs(os.path.join(sys.argv[3], sub))
    write_safetensors(os.path.join(sys.argv[3], sub, "model.safetensors"), named)
PY
cp "$work/kv2/config.json" "$work/renamed/" && cp "$work/kv2/config.json" "$work/extra/"
check "renamed in the file, --rename-weights" "$want" "$(gen --load-weights "$work/renamed" --rename-weights '^base\.=')"
if gen --load-weights "$work/extra" >/dev/null || ! grep -q "extra.bias" "$work/out.txt"; then
  echo "FAIL a tensor the model lacks: not an error naming it"
  failures=$((failures + 1))
fi
check "a tensor the model lacks, --lenient-weights" "$want" "$(gen --load-weights "$work/extra" --lenient-weights)"
grep -q "^warning: .*extra.bias" "$work/out.txt" || { echo "FAIL --lenient-weights: no warning"; failures=$((failures + 1)); }

# Fine-tune from Python's weights on 4 ranks, {data: 2, model: 2} + SP; save.
"$train" --model llama --steps 10 --log-every 10 --batch 8 --dtype float64 --ranks 4 --plan "$plan_2d" \
  --load-weights "$work/kv2" --save-weights "$work/tuned" >"$work/tune.txt" 2>&1 || { cat "$work/tune.txt"; exit 1; }
grep -q "saved weights to $work/tuned" "$work/tune.txt" || { cat "$work/tune.txt"; exit 1; }
if cmp -s "$work/kv2/model.safetensors" "$work/tuned/model.safetensors"; then
  echo "FAIL fine-tune: the saved weights are the loaded ones"
  failures=$((failures + 1))
fi
want=$($py "$ref" greedy "$work/tuned" "$prompt" $n)
check "fine-tuned, read back by Python" "$want" \
  "$(gen --load-weights "$work/tuned" --ranks 2 --plan "$plans/llama.yaml" --dump-logits "$work/tuned.safetensors")"
diff=$($py "$ref" logits "$work/tuned" "$prompt" "$work/tuned.safetensors") || diff="1 (not compared)"
within "fine-tuned, read back by Python" 1e-10 "$diff"

# A missing file is one clear line, before any step.
if "$train" --model llama --steps 0 --load-weights "$work/none" >"$work/bad.txt" 2>&1; then
  echo "FAIL missing weights: exit 0"
  failures=$((failures + 1))
elif ! grep -q "$work/none" "$work/bad.txt"; then
  echo "FAIL missing weights: the error does not name the path:"
  cat "$work/bad.txt"
  failures=$((failures + 1))
fi
# A config.json asking for what the example does not compute is refused,
# naming the file and the key, rather than loaded and computed otherwise.
mkdir -p "$work/scaled" && cp "$work/kv2/model.safetensors" "$work/scaled/"
$py -c "import json,sys; c=json.load(open(sys.argv[1])); c['rope_scaling']={'type':'linear','factor':2.0}; json.dump(c, open(sys.argv[2],'w'))" \
  "$work/kv2/config.json" "$work/scaled/config.json"
if "$train" --model llama --steps 0 --load-weights "$work/scaled" >"$work/bad.txt" 2>&1 ||
  ! grep -q "$work/scaled/config.json: rope_scaling is set" "$work/bad.txt"; then
  echo "FAIL rope_scaling: not refused as expected:"
  cat "$work/bad.txt"
  failures=$((failures + 1))
fi
exit $((failures > 0))
