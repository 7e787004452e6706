#!/usr/bin/env bash
# A checkpoint directory whose tokenizer, config.json and weights disagree,
# through train_model --load-weights DIR --generate (issue 37): refused
# before any weight is read, exit 1, one line on stderr naming the files.
#   tokenizer_larger: tokenizer.json's 557 ids, config.json's vocab_size 256
#   weights_rows: config.json's vocab_size 128, the weights' embedding 256 rows
#   unparsable: a tokenizer.json that is not JSON
# The weights are train_model's own (--save-weights), the tokenizer
# tests/tokenizer_reference.py's GPT-2-style one; no torch needed.
# usage: tokenizer_vocab.sh CASE TRAIN_MODEL WORK_DIR
set -uo pipefail
case=$1 train=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
vocab=256
[ "$case" = tokenizer_fits ] && vocab=560
"$train" --model llama --config vocab=$vocab,context=16,embed=8,heads=2,kv_heads=2,layers=1,mlp=12 --steps 1 \
  --batch 2 --save-weights "$work/ckpt" >"$work/save.txt" 2>&1 || { cat "$work/save.txt"; exit 1; }
python3 "$(dirname "$0")/../tokenizer_reference.py" "$work" gpt2 || exit 1
d=$work/ckpt
cp "$work/gpt2/tokenizer.json" "$d/"
case $case in
  tokenizer_larger | tokenizer_fits) ;;
  weights_rows)
    python3 - "$d/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["vocab_size"] = 128
json.dump(c, open(sys.argv[1], "w"))
PY
    cp "$work/gpt2/tokenizer.json" "$d/" ;;
  unparsable) printf '{"version": "1.0", "model": ' >"$d/tokenizer.json" ;;
  *) echo "unknown case '$case'"; exit 2 ;;
esac
timeout 60 "$train" --model llama --load-weights "$d" --steps 0 --generate 2 --prompt "Hi" >"$work/out.txt" 2>"$work/err.txt"
rc=$?
if [ "$case" = tokenizer_fits ]; then
  # The control: the same files with a vocab_size that holds the tokenizer.
  [ $rc -eq 0 ] && grep -q '^sample 1: "Hi|' "$work/out.txt" && { echo "ok: generated"; exit 0; }
  echo "FAIL: exit $rc"; cat "$work/out.txt" "$work/err.txt"; exit 1
fi
lines=$(grep -c . "$work/err.txt")
if [ $rc -ne 1 ] || [ "$lines" -ne 1 ]; then
  echo "FAIL $case: exit $rc (want 1), $lines lines on stderr (want 1):"; cat "$work/err.txt"; exit 1
fi
echo "refused: $(cat "$work/err.txt")"
