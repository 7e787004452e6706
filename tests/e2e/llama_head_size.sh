#!/usr/bin/env bash
# A Llama whose heads are not the default config's size: hidden 64 in 4
# heads of 16, 2 kv heads, written by train_model --save-weights
# (config.json + safetensors) and loaded back with --load-weights. Under
# plans/llama.yaml (head_dim: auto, the model's) the prompt's float64 logits
# at 2 and 4 thread ranks are one process's to 1e-12 (rope_theta 10001, the
# control, is not), and so is the greedy text. A plan that says head_dim: 32
# is refused, naming both sizes and the rule's file:line:col: at 2 ranks it
# used to read 2 "heads" of 32 and compute other numbers without an error.
# usage: llama_head_size.sh TRAIN_MODEL PLANS_DIR WORK_DIR
set -uo pipefail
train=$1 plans=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
failures=0

"$train" --model llama --config embed=64,heads=4,kv_heads=2,mlp=96 --steps 2 --batch 4 --dtype float64 \
  --save-weights "$work/w" >"$work/save.txt" 2>&1 || { cat "$work/save.txt"; exit 1; }
grep -q '"hidden_size": *64' "$work/w/config.json" || { echo "FAIL config.json has no hidden_size 64"; exit 1; }

gen() {  # LOGITS_FILE ARGS...: the greedy text of the saved model, float64, and the prompt's logits
  local logits=$1
  shift
  "$train" --model llama --steps 0 --load-weights "$work/w" --generate 16 --temperature 0 --samples 1 \
    --dtype float64 --prompt "From fairest" --dump-logits "$logits" "$@" >"$work/out.txt" 2>&1 ||
    { cat "$work/out.txt"; return 1; }
  sed -n 's/^sample 1: "\(.*\)"$/\1/p' "$work/out.txt"
}

# The largest |a - b| over two safetensors files' float64 "logits".
difference() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def logits(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    t = json.loads(data[8:8 + n])["logits"]
    lo, hi = t["data_offsets"]
    body = data[8 + n + lo:8 + n + hi]
    return struct.unpack("<%dd" % (len(body) // 8), body)
a, b = logits(sys.argv[1]), logits(sys.argv[2])
print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else "inf")
PY
}

within() {  # WHAT DIFFERENCE: at most 1e-12
  if awk -v d="$2" 'BEGIN { exit !(d + 0 <= 1e-12) }'; then
    echo "ok   $1: logits max |difference| $2 <= 1e-12"
  else
    echo "FAIL $1: logits max |difference| $2 > 1e-12"
    failures=$((failures + 1))
  fi
}

want=$(gen "$work/l1.safetensors" --ranks 1) || exit 1
[ -n "$want" ] || { echo "FAIL one process: no text"; cat "$work/out.txt"; exit 1; }
gen "$work/control.safetensors" --ranks 1 --config rope_theta=10001 >/dev/null || exit 1
d=$(difference "$work/l1.safetensors" "$work/control.safetensors")
if awk -v d="$d" 'BEGIN { exit !(d + 0 <= 1e-12) }'; then
  echo "FAIL rope_theta 10001 is within 1e-12 ($d): the comparison cannot catch a wrong model"
  failures=$((failures + 1))
fi
for ranks in 2 4; do
  got=$(gen "$work/l$ranks.safetensors" --ranks $ranks --plan "$plans/llama.yaml")
  within "$ranks ranks, head_dim: auto" "$(difference "$work/l1.safetensors" "$work/l$ranks.safetensors")"
  if [ "$got" = "$want" ]; then
    echo "ok   $ranks ranks, head_dim: auto: '$got'"
  else
    echo "FAIL $ranks ranks, head_dim: auto: expected '$want', got '$got'"
    failures=$((failures + 1))
  fi
done

plan32=$work/llama32.yaml
sed 's/head_dim: auto/head_dim: 32/' "$plans/llama.yaml" >"$plan32"
# The q_proj rule's head_dim is the first one; the value's column.
at=$(awk '/^ *head_dim:/ { print NR ":" index($0, "head_dim:") + 10; exit }' "$plan32")
error="$plan32:$at: head_dim: 32 is not the model's head size 16 for parameter \
'model.layers.0.self_attn.q_proj.weight' (out_features 64: 4 heads of 16)"
for ranks in 2 4; do
  if gen "$work/l32.safetensors" --ranks $ranks --plan "$plan32" >/dev/null; then
    echo "FAIL $ranks ranks, head_dim: 32: not refused"
    failures=$((failures + 1))
  elif ! grep -qF "$error" "$work/out.txt" || grep -q "heads of 32" "$work/out.txt"; then
    echo "FAIL $ranks ranks, head_dim: 32: the error is not '$error...':"
    cat "$work/out.txt"
    failures=$((failures + 1))
  else
    echo "ok   $ranks ranks, head_dim: 32 refused: $error"
  fi
done
exit $((failures > 0))
