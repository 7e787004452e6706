#!/usr/bin/env bash
# Generating from a checkpoint directory with its tokenizer (issue 37): a
# random Llama Python wrote with its tokenizer (KIND bpe: a byte-level BPE
# tokenizer.json; sentencepiece: a tokenizer.model python3-sentencepiece
# trains), tokenizer_config.json (BOS added) and generation_config.json
# (two EOS ids), read by train_model --load-weights DIR --steps 0 --prompt
# TEXT --generate N: the prompt goes through the tokenizer (UTF-8 past ASCII
# included), the sample is decoded text equal to Python's greedy decode
# (tests/e2e/llama_tokenizer.py: tests/tokenizer_reference.py's tokenizer or
# python3-sentencepiece, tests/llama/reference.py's float64 Llama), and
# generation stops at the EOS, which is the greedy's 4th new token or later
# by construction: unsharded, at 2 thread ranks and 2 gloo processes under
# plans/llama.yaml, greedy and sampled (a temperature of 1e-6 samples the
# argmax), 3 samples at once. Without the generation_config.json (an EOS
# the greedy does not reach) generation runs all N tokens.
# usage: llama_tokenizer.sh KIND TRAIN_MODEL SHARDPLAN_CLI PLANS_DIR WORK_DIR
set -uo pipefail
kind=$1 train=$2 cli=$3 plans=$4 work=$5
. "$(dirname "$0")/llama_common.sh"
if [ "$kind" = sentencepiece ] && ! $py -c "import sentencepiece" 2>/dev/null; then
  echo "skipped: $py cannot import sentencepiece (Debian's python3-sentencepiece)"
  exit 77
fi
tok=$(dirname "$0")/llama_tokenizer.py
rm -rf "$work" && mkdir -p "$work"
d=$work/llama-tiny-$kind
prompt="From fairest café creatures, 日本"
n=16
$py "$tok" write "$d" "$kind" || exit 1

# run NAME [LAUNCHER... --] ARGS...: each of train_model's samples and its stop
# line, as llama_tokenizer.py greedy prints them.
run() {
  local name=$1; shift
  local launcher=()
  if [[ " $* " == *" -- "* ]]; then
    while (($#)) && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
    shift
  fi
  "${launcher[@]}" "$train" --model llama --load-weights "$d" --steps 0 --generate $n --dtype float64 \
    --prompt "$prompt" "$@" >"$work/out.txt" 2>&1 || { echo "FAIL $name:"; cat "$work/out.txt"; failures=$((failures + 1)); return; }
  local texts stops i
  mapfile -t texts < <(sed -n 's/^\(\[rank 0\] \)\{0,1\}sample [0-9]*: "\(.*\)"$/\2/p' "$work/out.txt")
  mapfile -t stops < <(sed -n 's/^\(\[rank 0\] \)\{0,1\}sample [0-9]* \(stopped at EOS .*\)$/\2/p' "$work/out.txt")
  [ ${#texts[@]} -gt 0 ] || texts=("")
  for i in "${!texts[@]}"; do
    check "$name, sample $((i + 1)) text" "$want_text" "${texts[i]}"
    check "$name, sample $((i + 1)) stop" "$want_stop" "${stops[i]:-no EOS}"
  done
}

runs() {
  run "unsharded" --temperature 0 --samples 1
  run "2 thread ranks" --temperature 0 --samples 1 --ranks 2 --plan "$plans/llama.yaml"
  run "2 gloo processes" "$cli" launch -n 2 --backend gloo -- --temperature 0 --samples 1 --plan "$plans/llama.yaml"
  run "2 thread ranks, sampled, 3 samples" --temperature 1e-6 --top-k 0 --samples 3 --ranks 2 --plan "$plans/llama.yaml"
}

# First without an EOS it reaches: the whole N tokens.
mapfile -t ref < <($py "$tok" greedy "$d" "$prompt" $n)
want_text=${ref[0]} want_stop=${ref[1]}
[ "$want_stop" = "no EOS" ] || { echo "FAIL: the reference stopped already: ${ref[*]}"; exit 1; }
echo "the greedy's tokens: ${ref[2]}"
runs

# The EOS: the first new token from the 4th on that is not among the ones
# before it (so the stop is there, not earlier).
read -r -a ids <<<"${ref[2]}"
eos=
for ((k = 3; k < ${#ids[@]}; ++k)); do
  [[ " ${ids[*]:0:k} " == *" ${ids[k]} "* ]] || { eos=${ids[k]}; break; }
done
[ -n "$eos" ] || { echo "FAIL: no new token to stop at in ${ref[2]}"; exit 1; }
echo "{\"eos_token_id\": [${ref[3]}, $eos]}" >"$d/generation_config.json"
mapfile -t ref < <($py "$tok" greedy "$d" "$prompt" $n)
want_text=${ref[0]} want_stop=${ref[1]}
[ "$want_stop" = "stopped at EOS id $eos after $k tokens" ] || { echo "FAIL: the reference: ${ref[*]}"; exit 1; }
runs
if [ $failures -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all runs decode Python's text and stop where it does"
