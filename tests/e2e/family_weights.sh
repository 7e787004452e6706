#!/usr/bin/env bash
# Save back in the family's own config.json and names: weights Python wrote
# (tests/families/reference.py) are fine-tuned for 3 steps at 2 thread ranks
# under plans/llama.yaml (float64) and saved with --save-weights; the
# directory's config.json is the family's (model_type, architectures, its
# keys), and from it Python's greedy text is what C++ generates from it and
# Python's float64 logits C++'s to 1e-10. qwen2 (its biases saved split
# back whole) and gemma (tied, head_dim, the norm's w not 1 + w); the other
# families save through the same code (hf_config_json's table).
# usage: family_weights.sh TRAIN_MODEL PLANS_DIR WORK_DIR
set -uo pipefail
train=$1 plans=$2 work=$3
. "$(dirname "$0")/llama_common.sh"
ref=$(dirname "$0")/../families/reference.py
rm -rf "$work" && mkdir -p "$work"

for spec in "qwen2 Qwen2ForCausalLM num_key_value_heads=1" "gemma GemmaForCausalLM num_key_value_heads=1"; do
  read -r family arch kv <<<"$spec"
  d=$work/$family
  $py "$ref" write "$d" "$family" "$kv" || exit 1
  "$train" --steps 3 --log-every 3 --batch 4 --dtype float64 --ranks 2 --plan "$plans/llama.yaml" \
    --load-weights "$d" --save-weights "$d.tuned" >"$d.tune.txt" 2>&1 || { cat "$d.tune.txt"; exit 1; }
  if cmp -s "$d/model.safetensors" "$d.tuned/model.safetensors"; then
    echo "FAIL $family: the saved weights are the loaded ones"
    failures=$((failures + 1))
  fi
  $py - "$d/config.json" "$d.tuned/config.json" "$arch" <<'PY' || failures=$((failures + 1))
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bad = [k for k in ("model_type", "hidden_size", "num_key_value_heads", "head_dim", "tie_word_embeddings", "use_sliding_window",
                   "hidden_activation") if k in a and a[k] != b.get(k)]
if b.get("architectures") != [sys.argv[3]]:
    bad.append("architectures")
print(("FAIL saved config.json differs in " + ", ".join(bad)) if bad else "ok   saved config.json: " + b["model_type"])
sys.exit(1 if bad else 0)
PY
  want=$($py "$ref" greedy "$d.tuned" "$prompt" $n)
  check "$family fine-tuned, read back by Python" "$want" \
    "$(gen --load-weights "$d.tuned" --ranks 2 --plan "$plans/llama.yaml" --dump-logits "$d.tuned.safetensors")"
  diff=$($py "$ref" logits "$d.tuned" "$prompt" "$d.tuned.safetensors") || diff="1 (not compared)"
  within "$family fine-tuned, read back by Python" 1e-10 "$diff"
done
exit $((failures > 0))
