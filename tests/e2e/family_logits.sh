#!/usr/bin/env bash
# A Llama-like family (qwen2, mistral, gemma: config.json's model_type) from
# weights Python wrote, against the independent PyTorch reference of the
# family (tests/families/reference.py): train_model --load-weights DIR
# (--model llama, the family from config.json) generates greedily in float64
# and dumps the prompt's logits (through the key/value caches), unsharded, at
# 2 and 4 thread ranks and at 2 gloo processes under plans/llama.yaml, and at
# 4 thread ranks under --plan auto (shardplan's auto_plan). The
# text must be Python's and the logits within 1e-10 of Python's float64 ones.
# CONTROL, train_model options that undo what makes the family (mistral:
# window=0; qwen2: the biases dropped; gemma: computed as mistral), must
# give logits more than 1e-4 away: the check sees the family's difference.
# usage: family_logits.sh TRAIN_MODEL SHARDPLAN_CLI PLANS_DIR WORK_DIR FAMILY CONTROL [KEY=VALUE...]
set -uo pipefail
train=$1 cli=$2 plans=$3 work=$4 family=$5 control=$6
shift 6
. "$(dirname "$0")/llama_common.sh"
ref=$(dirname "$0")/../families/reference.py
rm -rf "$work" && mkdir -p "$work"
d=$work/w
$py "$ref" write "$d" "$family" "$@" || exit 1
want=$($py "$ref" greedy "$d" "$prompt" $n)
names=() files=()

# dump NAME [LAUNCHER... --] ARGS...: the run's greedy text must be Python's;
# its logits go to the next file.
dump() {
  local name=$1 file=$work/logits_${#files[@]}.safetensors
  shift
  check "$family $name, greedy" "$want" "$(gen "$@" --load-weights "$d" --dump-logits "$file")"
  names+=("$name") files+=("$file")
}

dump unsharded
dump "2 thread ranks" --ranks 2 --plan "$plans/llama.yaml"
dump "4 thread ranks" --ranks 4 --plan "$plans/llama.yaml"
dump "2 gloo processes" "$cli" launch -n 2 --backend gloo -- --plan "$plans/llama.yaml"
dump "--plan auto, 4 thread ranks" --ranks 4 --plan auto
# shellcheck disable=SC2086
gen --load-weights "$d" --dump-logits "$work/control.safetensors" $control >/dev/null
out=$($py "$ref" logits "$d" "$prompt" "${files[@]}" "$work/control.safetensors") && mapfile -t diffs <<<"$out" || diffs=()
if [ ${#diffs[@]} -ne $((${#files[@]} + 1)) ]; then
  printf '%s\n' "FAIL $family: reference.py logits did not compare every file:" "$out"
  exit 1
fi
for ((i = 0; i < ${#files[@]}; ++i)); do within "$family ${names[$i]}" 1e-10 "${diffs[$i]}"; done
if at_most "${diffs[-1]%% *}" 1e-4; then
  echo "FAIL $family: the control ($control) is within 1e-4 of Python: the check cannot see the family"
  failures=$((failures + 1))
else
  echo "ok   $family: the control ($control) is ${diffs[-1]%% *} away"
fi
exit $((failures > 0))
