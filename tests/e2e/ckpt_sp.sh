#!/usr/bin/env bash
# ckpt_sp.sh SHARDPLAN TRAIN_GPT PLANS_DIR
# Checkpoints with sequence parallelism (docs/CHECKPOINTS.md): plans/gpt_sp.yaml
# on 2 gloo processes saves after 4 steps, plans/gpt_async.yaml resumes and
# saves after 8, the plain model resumes to 12; every step's loss equals an
# uninterrupted single-process run's (float64, Adam).
set -u
SP=$1
TRAIN=$2
PLANS=$3
source "$(dirname "$0")/ckpt_common.sh" ckpt-sp

train=("$TRAIN" --config context=16,embed=32,mlp=64 --dtype float64 --batch 8 --log-every 1 --optimizer adam)
gloo() { local n=$1; shift; "$SP" launch -n "$n" --backend gloo -- "${train[@]}" "$@"; }

run reference "${train[@]}" --steps 12
run sp gloo 2 --plan "$PLANS/gpt_sp.yaml" --steps 4 --save "$WORK/a"
run async gloo 2 --plan "$PLANS/gpt_async.yaml" --steps 8 --load "$WORK/a" --save "$WORK/b"
run plain "${train[@]}" --steps 12 --load "$WORK/b"

cat "$WORK"/{sp,async,plain}.log >"$WORK/chain.txt"
same_losses "$WORK/reference.log" "$WORK/chain.txt" 12
echo "ok: 12 steps through gpt_sp -> gpt_async -> plain match the uninterrupted run"
