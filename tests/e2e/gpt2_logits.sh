#!/usr/bin/env bash
# GPT-2 (examples/models/gpt2.h) against an independent PyTorch GPT-2
# (tests/gpt2/reference.py: its own float64 forward, Conv1D x @ W + b) for
# weights Python wrote in GPT-2's layout (Conv1D weights [in, out], fused
# c_attn, float32 safetensors + config.json):
#   - names as the original checkpoints ("h.0...", "wte.weight", with the
#     old attn.bias / attn.masked_bias buffers): train_model --load-weights
#     --steps 0, float64, unsharded, at 2 and 4 thread ranks and 2 gloo
#     processes under plans/gpt2.yaml (and at 4 under --plan auto): logits
#     within 1e-10 of Python's (measured: about 4e-15), greedy text Python's;
#   - names as GPT2LMHeadModel saves them ("transformer."), at 2 ranks;
#   - 3 training steps under plans/gpt2.yaml at 2 ranks equal 3 unsharded
#     (float64, every weight within 1e-10; measured 2e-12), and so do the
#     losses of 3 steps pipelined over {pipe: 2} (1e-10); saved back with
#     --save-weights: Python loads the directory (Conv1D shapes checked, its
#     config.json) and its logits equal train_model's from it;
#   - bad input, one line each: activation_function "gelu", and a c_attn
#     stored [3E, E] (not Conv1D's [E, 3E]) naming the file and the tensor.
# usage: gpt2_logits.sh TRAIN_MODEL SHARDPLAN_CLI PLANS_DIR WORK_DIR
set -uo pipefail
train=$1 cli=$2 plans=$3 work=$4
py=/usr/bin/python3
if ! $py -c "import torch, numpy" 2>/dev/null; then
  echo "skipped: $py cannot import torch (Debian's python3-torch)"
  exit 77
fi
ref=$(dirname "$0")/../gpt2/reference.py
prompt="From fairest creatures"
n=12 bound=1e-10 failures=0
rm -rf "$work" && mkdir -p "$work"

fail() { echo "FAIL $*"; failures=$((failures + 1)); }
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }
# Python imports torch once per phase (seconds on a busy machine).
reference() { $py "$ref" batch "$prompt" $n "$@"; }

# run [LAUNCHER... --] ARGS...: train_model --model gpt2 --dtype float64 ARGS;
# output in $work/out.txt, the greedy sample's text on stdout.
run() {
  local launcher=()
  if [[ " $* " == *" -- "* ]]; then
    while (($#)) && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
    shift
  fi
  "${launcher[@]}" "$train" --model gpt2 --dtype float64 "$@" >"$work/out.txt" 2>&1 || { cat "$work/out.txt"; return 1; }
  sed -n 's/^\(\[rank 0\] \)\{0,1\}sample 1: "\(.*\)"$/\2/p' "$work/out.txt"
}

# dump NAME DIR ARGS...: greedy text and logits of DIR's weights under ARGS,
# checked against Python's after all runs (names, dirs, texts, files).
names=() dirs=() texts=() files=()
dump() {
  local name=$1 dir=$2 file=$work/logits_${#files[@]}.safetensors
  shift 2
  local args=(--load-weights "$dir" --steps 0 --generate $n --temperature 0 --samples 1 --prompt "$prompt"
    --dump-logits "$file")
  if [[ " $* " == *" -- "* ]]; then
    texts+=("$(run "$@" "${args[@]}")")
  else
    texts+=("$(run "${args[@]}" "$@")")
  fi
  names+=("$name") dirs+=("$dir") files+=("$file")
}

# bad NAME DIR WORD...: train_model refuses DIR in one line holding every WORD.
bad() {
  local name=$1 dir=$2 out line
  shift 2
  if out=$("$train" --model gpt2 --load-weights "$dir" --steps 0 --ranks 2 --plan "$plans/gpt2.yaml" \
    --dump-logits "$work/bad.safetensors" 2>&1); then
    fail "$name: accepted"
    return
  fi
  line=$(grep 'error' <<<"$out")
  [ "$(grep -c . <<<"$line")" = 1 ] || { fail "$name: not one error line: $out"; return; }
  for w in "$@"; do [[ "$line" == *"$w"* ]] || { fail "$name: '$w' not in: $line"; return; }; done
  echo "ok   $name: $line"
}

orig=$work/orig prefixed=$work/prefixed trained=$work/trained2
reference write:"$orig":buffers=1 write:"$prefixed":prefix=1:seed=8:n_inner=96 \
  write:"$work/gelu":activation_function='"gelu"' write:"$work/unfused":unfused=1 || exit 1
dump "h.* names, unsharded" "$orig"
dump "h.* names, 2 threads" "$orig" --ranks 2 --plan "$plans/gpt2.yaml"
dump "h.* names, 4 threads" "$orig" --ranks 4 --plan "$plans/gpt2.yaml"
dump "h.* names, 4 threads, --plan auto" "$orig" --ranks 4 --plan auto
dump "h.* names, 2 gloo" "$orig" "$cli" launch -n 2 --backend gloo -- --plan "$plans/gpt2.yaml"
dump "transformer.* names, 2 threads" "$prefixed" --ranks 2 --plan "$plans/gpt2.yaml"
# Training under the plan equals training unsharded; saved back, Python reads it.
run --load-weights "$orig" --steps 3 --batch 4 --save-weights "$work/trained1" --log-every 1 >/dev/null ||
  fail "unsharded training"
losses() { sed -n 's/^\(\[rank 0\] \)\{0,1\}step *\([0-9]*\)  loss \([0-9.e+-]*\).*/\2 \3/p' "$work/out.txt"; }
unsharded_losses=$(losses)
# The pipeline pieces: {pipe: 2}, 1F1B over 2 micro-batches, the same losses.
printf '%s\n' 'version: 1' 'mesh: {pipe: 2}' 'pipeline: {axis: pipe, schedule: 1f1b, micro_batches: 2, stages: auto}' \
  'rules: []' >"$work/pipe.yaml"
run --load-weights "$orig" --steps 3 --batch 4 --log-every 1 --ranks 2 --plan "$work/pipe.yaml" >/dev/null ||
  fail "pipelined training"
if [ "$(wc -l <<<"$unsharded_losses")" = 3 ] && awk 'NR == FNR { want[$1] = $2; next }
    { d = $2 - want[$1]; if (d < 0) d = -d; if (!($1 in want) || d > 1e-10) bad = 1 } END { exit bad }' \
    <(echo "$unsharded_losses") <(losses); then
  echo "ok   {pipe: 2} losses = unsharded:" $unsharded_losses
else
  fail "{pipe: 2} losses $(losses | tr '\n' ' ') differ from unsharded $(echo $unsharded_losses)"
fi
run --load-weights "$orig" --steps 3 --batch 4 --save-weights "$trained" --ranks 2 --plan "$plans/gpt2.yaml" \
  >/dev/null || fail "training at 2 ranks"
dump "saved back, 2 threads" "$trained" --ranks 2 --plan "$plans/gpt2.yaml"

items=(same:"$work/trained1":"$trained")
for ((i = 0; i < ${#files[@]}; ++i)); do items+=(greedy:"${dirs[$i]}" logits:"${dirs[$i]}":"${files[$i]}"); done
out=$(reference "${items[@]}") && mapfile -t lines <<<"$out" || lines=()
if [ ${#lines[@]} -ne $((1 + 2 * ${#files[@]})) ]; then
  fail "reference.py did not check every run: $out"
else
  at_most "${lines[0]}" $bound && echo "ok   3 steps at 2 ranks = unsharded: max weight difference ${lines[0]}" ||
    fail "3 steps at 2 ranks differ from unsharded by ${lines[0]}"
  for ((i = 0; i < ${#files[@]}; ++i)); do
    want=${lines[$((1 + 2 * i))]} diff=${lines[$((2 + 2 * i))]%% *}
    [ "${texts[$i]}" = "$want" ] && echo "ok   ${names[$i]}, greedy: $want" ||
      fail "${names[$i]}, greedy: expected '$want', got '${texts[$i]}'"
    at_most "$diff" $bound && echo "ok   ${names[$i]}: logits max |C++ - Python| $diff <= $bound" ||
      fail "${names[$i]}: logits max |C++ - Python| $diff > $bound"
  done
fi

bad "activation gelu" "$work/gelu" config.json activation_function
bad "c_attn not Conv1D" "$work/unfused" model.safetensors h.0.attn.c_attn.weight
exit $((failures > 0))
