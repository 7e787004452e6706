#!/bin/sh
# `shardplan plan check --script`: the traced GPT twins of make_models.py
# under the head-parallel plan. Without a probe the traced twin is refused
# (run verify); with one it passes, and the twin whose head count the tracer
# baked in fails, reporting its difference; a refused plan prints its error alone.
#   plan_check_script.sh CLI PYTHON3 SOURCE_DIR WORK_DIR      (exit 77: no torch)
set -u
cli=$1 py=$2 src=$3 work=$4
mkdir -p "$work"
"$py" "$src/tests/script/make_models.py" "$work/models" || exit $?
plan=$src/tests/script/gpt_head_parallel.yaml
fail() { echo "FAIL: $*"; exit 1; }
# $1: expected exit status, $2: a line the output must contain, then the CLI's arguments.
expect() {
  want=$1 line=$2
  shift 2
  out=$("$cli" plan check "$plan" --world 2 "$@" 2>&1)
  rc=$?
  echo "$out" | tail -n 4
  [ "$rc" = "$want" ] || fail "exit status $rc, expected $want: $*"
  echo "$out" | grep -qF -- "$line" || fail "no '$line' in the output of: $*"
}
expect 1 "run verify first" --script "$work/models/gpt_traced.pt"
expect 0 "note: verify: output [3, 6, 48]: largest difference" --script "$work/models/gpt_traced.pt" --probe 3x6:48
expect 1 "error: verify: output [3, 6, 48]: largest difference" --script "$work/models/gpt_traced_baked.pt" --probe 3x6:48
expect 1 "--probe 3x6:x: after the shape" --script "$work/models/gpt.pt" --probe 3x6:x
# A plan the rewrite refuses compared nothing: its error is the first, and no
# "largest difference" of a comparison that never ran is printed.
printf "mesh: {model: auto}\nrules:\n  - {match: 'w', layout: [model, null]}\n" > "$work/einsum.yaml"
out=$("$cli" plan check "$work/einsum.yaml" --world 2 --script "$work/models/einsum.pt" --probe 4x12 2>&1)
rc=$?
echo "$out" | tail -n 4
[ "$rc" = 1 ] || fail "exit status $rc for the refused einsum plan"
first=$(echo "$out" | grep -m1 '^error:')
echo "$first" | grep -qF "aten::einsum (input 1, in a list) at " || fail "first error: $first"
echo "$out" | grep -qF "largest difference" && fail "a comparison that never ran is printed"
echo "ok"
