#!/usr/bin/env bash
# A family's config.json that the example cannot compute, through
# train_model --load-weights DIR: each is refused before any layer is built,
# exit 1, one line on stderr naming the file and the key, and the file is
# left as it was: an unknown model_type (listing the known ones), a key the
# family needs that is missing (gemma's head_dim, mistral's sliding_window),
# a key the example does not honour (qwen2's use_sliding_window, rope_scaling),
# and --model naming another model than the file's model_type.
# usage: family_bad_config.sh TRAIN_MODEL WORK_DIR
set -uo pipefail
train=$1 work=$2
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work"
failures=0
. "$(dirname "$0")/one_line_error.sh"
"$train" --model llama --config vocab=256,context=16,embed=16,heads=2,kv_heads=1,layers=1,mlp=24,family=gemma,head_dim=12,tie=1 \
  --steps 1 --batch 2 --save-weights "$work/good" >"$work/save.txt" 2>&1 || { cat "$work/save.txt"; exit 1; }

# refused NAME 'PYTHON EDIT OF c' [train_model options] -- WANT...
refused() {
  local name=$1 edit=$2; shift 2
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  local d=$work/$name
  cp -r "$work/good" "$d"
  $py -c "import json,sys; c=json.load(open(sys.argv[1])); $edit; json.dump(c, open(sys.argv[1],'w'))" "$d/config.json"
  cp "$d/config.json" "$d.before"
  timeout 60 "$train" --load-weights "$d" --steps 0 --generate 4 --prompt ab "${opts[@]}" >"$d.out" 2>"$d.err"
  one_line_error "$name" $? "$d.err" "$@" "$d/config.json" || return
  cmp -s "$d/config.json" "$d.before" || { echo "FAIL $name: config.json changed"; failures=$((failures + 1)); }
  echo "ok   $name: $(cat "$d.err")"
}

# The saved directory itself loads (no --model: config.json's model_type picks llama's example).
"$train" --load-weights "$work/good" --steps 0 --generate 4 --prompt ab >"$work/good.out" 2>&1 ||
  { echo "FAIL the saved gemma directory does not load:"; cat "$work/good.out"; failures=$((failures + 1)); }
grep -q '"model_type": "gemma"' "$work/good/config.json" || { echo "FAIL no model_type gemma"; failures=$((failures + 1)); }

refused unknown_type "c['model_type']='bert'" -- "model_type \"bert\"" "llama, qwen2, mistral, gemma, phi3, gpt2"
refused gemma_no_head_dim "del c['head_dim']" -- "head_dim is missing"
silu="c['hidden_act']='silu'; c.pop('hidden_activation'); c.pop('head_dim')"
refused mistral_no_window "$silu; c['model_type']='mistral'" -- "sliding_window is missing"
refused qwen2_window "$silu; c['model_type']='qwen2'; c['use_sliding_window']=True" -- "use_sliding_window"
refused rope_scaling "c['rope_scaling']={'type': 'linear', 'factor': 2.0}" -- "rope_scaling is set"
refused gemma_activation "c['hidden_activation']='gelu'" -- "hidden_activation"
refused other_model "pass" --model gpt -- "model_type 'gemma'" "--model gpt"
exit $((failures > 0))
