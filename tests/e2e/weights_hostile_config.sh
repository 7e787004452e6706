#!/usr/bin/env bash
# config.json sizes nothing can hold, through train_model --load-weights
# (issue 33): each is refused at once, in one line naming the key and the
# file (and the parameter it makes too large), before any layer is built.
# Before: num_hidden_layers 2^31 built layers for minutes; vocab_size 2^40
# failed in DeferredInit naming neither; a config.json that is a named pipe
# blocked the open for ever.
# usage: weights_hostile_config.sh TRAIN_MODEL WORK_DIR
set -uo pipefail
train=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
. "$(dirname "$0")/one_line_error.sh"
"$train" --model llama --config vocab=256,context=16,embed=8,heads=2,kv_heads=2,layers=2,mlp=12 --steps 1 \
  --batch 2 --save-weights "$work/good" >"$work/save.txt" 2>&1 || { cat "$work/save.txt"; exit 1; }

# refused NAME KEY=VALUE [more train_model options] -- WANT...: a copy of the
# weights whose config.json has KEY set to VALUE is refused within 60 s, exit
# 1, one line on stderr holding every WANT.
refused() {
  local name=$1 kv=$2; shift 2
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  local d=$work/$name
  cp -r "$work/good" "$d"
  if [ "$kv" = fifo ]; then
    rm "$d/config.json" && mkfifo "$d/config.json"
  else
    python3 - "$d/config.json" "${kv%%=*}" "${kv#*=}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c[sys.argv[2]] = int(sys.argv[3])
json.dump(c, open(sys.argv[1], "w"))
PY
  fi
  timeout 60 "$train" --model llama --load-weights "$d" --steps 0 --generate 4 "${opts[@]}" \
    >"$d.out" 2>"$d.err"
  one_line_error "$name" $? "$d.err" "$@" "$d/config.json" || return
  echo "ok $name: $(cat "$d.err")"
}

refused layers num_hidden_layers=2147483648 -- "num_hidden_layers 2147483648" "2 layers"
refused layers_lenient num_hidden_layers=2147483648 --lenient-weights -- "num_hidden_layers 2147483648" "memory available"
refused vocab vocab_size=1099511627776 -- "vocab_size 1099511627776" "model.embed_tokens.weight"
refused fifo fifo -- "not a regular file"
exit $((failures > 0))
