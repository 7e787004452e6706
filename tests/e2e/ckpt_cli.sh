#!/usr/bin/env bash
# ckpt_cli.sh SHARDPLAN TRAIN_MODEL PLAN
# `shardplan ckpt`: a checkpoint saved at 2 ranks (train_model --save) is
# inspected, converted to 4 ranks and to 1 and resumed there with the losses
# of an uninterrupted run; inspect fails on a flipped byte, a truncated and a
# missing piece file, naming the file; usage errors exit 2.
set -u
SP=$1
TRAIN=$2
PLAN=$3
source "$(dirname "$0")/ckpt_common.sh" ckpt-cli

train=("$TRAIN" --model gpt --config vocab=256,context=16,embed=32,heads=4,layers=1,mlp=64 --dtype float64
  --batch 4 --log-every 1 --seed 5 --optimizer sgd)
losses() { awk '$1 == "step" && $3 == "loss" {print $2, $4}' "$1"; }
same_losses() {
  local n
  n=$(join <(losses "$1") <(losses "$2") | awk '
    { d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > 1e-7 * s) { print "step " $1 ": " $2 " vs " $3 > "/dev/stderr"; bad = 1 } n++ }
    END { print n; exit bad }') || fail "$2: losses differ from the uninterrupted run"
  [[ $n -eq $3 ]] || fail "$2: compared $n steps, expected $3"
}
# expect RC CMD...: runs CMD with output in $WORK/out.log, $WORK/err.log; checks the status.
expect() {
  local want=$1
  shift
  "$@" >"$WORK/out.log" 2>"$WORK/err.log"
  local rc=$?
  [[ $rc -eq $want ]] || fail "'$*' exited with $rc, expected $want"
}

"${train[@]}" --steps 6 >"$WORK/reference.log" 2>&1 || fail "the uninterrupted run failed"
"${train[@]}" --steps 3 --ranks 2 --plan "$PLAN" --save "$WORK/c2" >"$WORK/save.log" 2>&1 || fail "saving failed"

expect 0 "$SP" ckpt inspect "$WORK/c2"
grep -q '^format version 1, world size 2, mesh {model: 2}$' "$WORK/out.log" || fail "inspect: no world size 2"
grep -q '^attribute step: 3$' "$WORK/out.log" || fail "inspect: no step attribute"
grep -Eq '^blocks\.0\.attn\.in_proj_weight +float64 +\[96, 32\] +\[model, null\] +2$' "$WORK/out.log" ||
  fail "inspect: no row for in_proj_weight"
grep -Eq '^checksums: all [0-9]+ pieces verified$' "$WORK/out.log" || fail "inspect: checksums not verified"

expect 0 "$SP" ckpt convert "$WORK/c2" --to-world 4 --out "$WORK/c4"
grep -q "^wrote $WORK/c4: world size 4, mesh {model: 4}" "$WORK/out.log" || fail "convert: no summary"
expect 0 "$SP" ckpt inspect "$WORK/c4"
"${train[@]}" --steps 6 --ranks 4 --plan "$PLAN" --load "$WORK/c4" >"$WORK/resumed4.log" 2>&1 || fail "loading c4 failed"
same_losses "$WORK/reference.log" "$WORK/resumed4.log" 3

expect 0 "$SP" ckpt convert "$WORK/c2" --to-world 1 --out "$WORK/c1"
"${train[@]}" --steps 6 --load "$WORK/c1" >"$WORK/resumed1.log" 2>&1 || fail "loading c1 unsharded failed"
same_losses "$WORK/reference.log" "$WORK/resumed1.log" 3

# In place, back to 2 ranks from 4.
expect 0 "$SP" ckpt convert "$WORK/c4" --to-world 2 --out "$WORK/c4"
"${train[@]}" --steps 6 --ranks 2 --plan "$PLAN" --load "$WORK/c4" >"$WORK/resumed2.log" 2>&1 || fail "loading c4 at 2 failed"
same_losses "$WORK/reference.log" "$WORK/resumed2.log" 3
[[ ! -e $WORK/c4.partial ]] || fail "convert left c4.partial behind"

# --plan: another mesh for the new world; tensors keep their axis (model).
printf 'mesh: {data: 2, model: auto}\nrules: []\n' >"$WORK/dp.yaml"
expect 0 "$SP" ckpt convert "$WORK/c2" --to-world 4 --plan "$WORK/dp.yaml" --out "$WORK/dp"
grep -q "^wrote $WORK/dp: world size 4, mesh {data: 2, model: 2}" "$WORK/out.log" || fail "convert --plan: wrong mesh"
[[ -e $WORK/dp/rank-00001.bin && ! -e $WORK/dp/rank-00002.bin ]] || fail "convert --plan: data replicas wrote pieces"
"${train[@]}" --steps 6 --ranks 4 --plan "$PLAN" --load "$WORK/dp" >"$WORK/resumed_dp.log" 2>&1 || fail "loading dp failed"
same_losses "$WORK/reference.log" "$WORK/resumed_dp.log" 3
printf 'mesh: {data: auto}\nrules: []\n' >"$WORK/nomodel.yaml"
expect 1 "$SP" ckpt convert "$WORK/c2" --to-world 2 --plan "$WORK/nomodel.yaml" --out "$WORK/never"
grep -q "is split over mesh axis 'model', which the mesh {data: 2} for 2 ranks does not have" "$WORK/err.log" ||
  fail "convert --plan: missing axis not reported"

expect 0 "$SP" ckpt convert "$WORK/c2" --full --out "$WORK/full.pt"
[[ -s $WORK/full.pt ]] || fail "convert --full wrote nothing"

# Broken copies: each names its file, exit status 1.
cp -a "$WORK/c2" "$WORK/flipped"
printf '\x7f' | dd of="$WORK/flipped/rank-00001.bin" bs=1 seek=100 conv=notrunc status=none
expect 1 "$SP" ckpt inspect "$WORK/flipped"
grep -q "^shardplan ckpt inspect: '$WORK/flipped/rank-00001.bin' is corrupted: checksum of tensor '" "$WORK/err.log" ||
  fail "inspect: flipped byte not reported"
grep -Eq '^checksums: 1 of [0-9]+ pieces bad$' "$WORK/out.log" || fail "inspect: no count of bad pieces"
expect 1 "$SP" ckpt convert "$WORK/flipped" --to-world 4 --out "$WORK/never"
grep -q "rank-00001.bin' is corrupted" "$WORK/err.log" || fail "convert: flipped byte not reported"
[[ ! -e $WORK/never ]] || fail "a failed convert created its output"

cp -a "$WORK/c2" "$WORK/truncated"
truncate -s 1000 "$WORK/truncated/rank-00000.bin"
expect 1 "$SP" ckpt inspect "$WORK/truncated"
grep -q "'$WORK/truncated/rank-00000.bin' is truncated" "$WORK/err.log" || fail "inspect: truncation not reported"

cp -a "$WORK/c2" "$WORK/missing"
rm "$WORK/missing/rank-00001.bin"
expect 1 "$SP" ckpt inspect "$WORK/missing"
grep -q "'$WORK/missing/rank-00001.bin' is missing" "$WORK/err.log" || fail "inspect: missing file not reported"
rm "$WORK/missing/metadata.yaml"
expect 1 "$SP" ckpt inspect "$WORK/missing"
grep -q "metadata.yaml' is missing: not a complete checkpoint" "$WORK/err.log" || fail "inspect: no metadata not reported"

expect 2 "$SP" ckpt convert "$WORK/c2" --to-world 4
grep -q "^shardplan ckpt convert: --out is required$" "$WORK/err.log" || fail "usage: --out"
expect 2 "$SP" ckpt convert "$WORK/c2" --to-world 0 --out "$WORK/x"
expect 2 "$SP" ckpt convert "$WORK/c2" --to-world 2 --full --out "$WORK/x"
expect 2 "$SP" ckpt frobnicate
expect 0 "$SP" help ckpt
grep -q '^usage: shardplan ckpt convert' "$WORK/out.log" || fail "'shardplan help ckpt' shows no usage"
echo "ok"
