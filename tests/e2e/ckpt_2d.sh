#!/usr/bin/env bash
# ckpt_2d.sh SHARDPLAN TRAIN_GPT PLANS_DIR
# Checkpoints across 2-D meshes and ZeRO-1 (docs/CHECKPOINTS.md), processes
# on gloo: {data: 2, model: 2} with ZeRO-1 saves after 4 steps, {model: 2}
# resumes and saves, the plain model resumes and saves, {data: 2, model: 2}
# without ZeRO resumes and saves, ZeRO-1 again resumes; every step's loss
# equals an uninterrupted single-process run's (float64, Adam), and each 2-D
# checkpoint has files from the data-coordinate-0 ranks only.
set -u
SP=$1
TRAIN=$2
PLANS=$3
source "$(dirname "$0")/ckpt_common.sh" ckpt-2d
# Small buckets: several per model, so ZeRO slices cut parameters anywhere.
sed 's/^data_parallel: {bucket_mb: 25}$/data_parallel: {bucket_mb: 0.02, zero: true}/' "$PLANS/gpt_2d.yaml" >"$WORK/zero.yaml"
grep -q 'zero: true' "$WORK/zero.yaml" || fail "plans/gpt_2d.yaml changed: no data_parallel line to edit"

train=("$TRAIN" --config context=16,embed=32,mlp=64 --dtype float64 --batch 8 --log-every 1 --optimizer adam)
gloo() { local n=$1; shift; "$SP" launch -n "$n" --backend gloo -- "${train[@]}" "$@"; }
only_data0_files() {
  local got
  got=$(cd "$1" && ls | tr '\n' ' ')
  [[ $got == "metadata.yaml rank-00000.bin rank-00001.bin " ]] || fail "$1 holds '$got', not the data-coordinate-0 ranks' files only"
}

run reference "${train[@]}" --steps 14
run zero_2d gloo 4 --plan "$WORK/zero.yaml" --steps 4 --save "$WORK/a"
only_data0_files "$WORK/a"
run model2 gloo 2 --plan "$PLANS/gpt.yaml" --steps 7 --load "$WORK/a" --save "$WORK/b"
run plain "${train[@]}" --steps 9 --load "$WORK/b" --save "$WORK/c"
run replicated_2d gloo 4 --plan "$PLANS/gpt_2d.yaml" --steps 11 --load "$WORK/c" --save "$WORK/d"
only_data0_files "$WORK/d"
run zero_2d_again gloo 4 --plan "$WORK/zero.yaml" --steps 14 --load "$WORK/d"

cat "$WORK"/{zero_2d,model2,plain,replicated_2d,zero_2d_again}.log >"$WORK/chain.txt"
same_losses "$WORK/reference.log" "$WORK/chain.txt" 14
echo "ok: 14 steps through zero 2d -> model2 -> plain -> 2d -> zero 2d match the uninterrupted run"
