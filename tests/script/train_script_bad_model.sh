#!/bin/sh
# train_script --model given what is not a TorchScript module (a torch.save
# state dict, random bytes, a missing file): exit 1 with one line naming the
# file, not libtorch's message and its backtrace. The files are made here.
#   train_script_bad_model.sh TRAIN_SCRIPT PYTHON3 SOURCE_DIR WORK_DIR      (exit 77: no torch)
set -u
exe=$1 py=$2 src=$3 work=$4
"$py" -c "import torch" 2>/dev/null || exit 77
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$py" -c "import sys, torch; torch.save({'w': torch.zeros(2)}, sys.argv[1])" "$work/state_dict.pt" || fail "torch.save"
head -c 65536 /dev/urandom > "$work/random.pt"
rm -f "$work/missing.pt"
for f in "$work/state_dict.pt" "$work/random.pt" "$work/missing.pt"; do
  out=$("$exe" --model "$f" --plan "$src/examples/script_gpt.yaml" --ranks 2 2>&1)
  rc=$?
  echo "$out"
  [ "$rc" = 1 ] || fail "exit status $rc for $f"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "more than one line for $f"
  printf '%s\n' "$out" | grep -qF "'$f'" || fail "the file is not named for $f"
done
echo "ok"
