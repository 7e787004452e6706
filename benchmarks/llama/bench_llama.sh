#!/usr/bin/env bash
# Issue 20's Llama benchmark in one invocation (docs/BENCHMARKS.md, "Llama
# example"): the example Llama at a size where compute dominates, unsharded
# (with the default threads, and with one: the 2-rank runs have one each)
# and under plans/llama.yaml at 2 ranks, as threads (--ranks 2, local
# backend) and as gloo processes (shardplan launch), side by side:
#   - generation from loaded weights (--steps 0 --load-weights DIR
#     --generate N), prefill and decode tokens/s apart;
#   - training tokens/s (the second half of a few steps: the first pay for
#     the allocator's and the caches' warm-up);
#   - resident memory per process at load and during generation
#     (SHARDPLAN_REPORT_MEMORY=1; thread ranks share one process), as the
#     example runs and again with glibc giving freed memory back
#     (MALLOC_TRIM_THRESHOLD_=0), which shows what the process holds;
#   - load time and the memory a load needs, shard-on-load (mmap-slice) vs
#     each tensor whole then sliced vs the whole file then sliced
#     (bench_llama_load: the modes interleaved in one run, medians), at 1
#     rank, 2 thread ranks and 2 and 4 gloo processes.
# Every setting runs once per round, rounds interleaved and each round
# starting at another setting, so a shared machine's noise hits all alike.
# Prints the date, the machine, its load before and after, then a summary.
#
#   benchmarks/llama/bench_llama.sh [BUILD_DIR] [WORK_DIR]
#
# Environment: LLAMA_CONFIG (the model's --config), ROUNDS (default 3),
# LOAD_REPS (default 7). 4-7 minutes on 2 shared cores at the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
WORK=${2:-/tmp/bench_llama}
# head_dim 32, what plans/llama.yaml's head_dim says; kv_heads 8 divide over 2 ranks.
CONFIG=${LLAMA_CONFIG:-embed=768,heads=24,kv_heads=8,layers=4,mlp=2048,context=256}
ROUNDS=${ROUNDS:-3}
LOAD_REPS=${LOAD_REPS:-7}
SAMPLES=4 PROMPT_BYTES=128 NEW=64               # generation: batch 4, prefill 4 x 128, 63 decode steps
TRAIN_STEPS=6 TRAIN_BATCH=4 TRAIN_CONTEXT=128   # training: 512 tokens a step
PLAN=plans/llama.yaml
TRAIN="$BUILD/examples/train_model" CLI="$BUILD/bin/shardplan" LOAD="$BUILD/bin/bench_llama_load"
for f in "$TRAIN" "$CLI" "$LOAD"; do
  [[ -x $f ]] || { echo "bench_llama.sh: $f is missing; build train_model shardplan_cli bench_llama_load" >&2; exit 2; }
done
SETUPS=("unsharded" "unsharded, 1 thread" "2 threads" "2 gloo processes")
# The command of a setup, then its own options.
run() {
  local setup=$1
  shift
  case $setup in
    unsharded) "$TRAIN" --model llama "$@" ;;
    "unsharded, 1 thread") "$TRAIN" --model llama --threads 1 "$@" ;;
    "2 threads") "$TRAIN" --model llama --ranks 2 --plan "$PLAN" "$@" ;;
    "2 gloo processes") "$CLI" launch -n 2 --backend gloo -- "$TRAIN" --model llama --plan "$PLAN" "$@" ;;
  esac 2>&1 | sed 's/^\[rank [0-9]*\] //'
}
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR] = $1} END {print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$SECONDS
rm -rf "$WORK" && mkdir -p "$WORK"
weights=$WORK/weights
# One training step saves the weights and their config.json (the example's
# own writer; the reader does not care where a file came from).
"$TRAIN" --model llama --config "$CONFIG" --steps 1 --batch 1 --save-weights "$weights" >"$WORK/write.log" 2>&1 ||
  { cat "$WORK/write.log"; exit 1; }
echo "model: $(grep -m1 '^model llama' "$WORK/write.log" | sed 's/; threads.*//'); $(du -sh "$weights"/*.safetensors | cut -f1) of float32"
# No `| head` after tr: under pipefail, tr's SIGPIPE would end the script.
text=$(head -c 4096 examples/data/sonnets.txt | tr -s '\n ' '  ')
prompt=${text:0:PROMPT_BYTES}

declare -A pre dec trn
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#SETUPS[@]}; k++)); do
    s=${SETUPS[(k + r) % ${#SETUPS[@]}]}
    log="$WORK/gen-${s// /_}-$r.log"
    SHARDPLAN_REPORT_MEMORY=1 run "$s" --steps 0 --load-weights "$weights" --generate "$NEW" --samples "$SAMPLES" \
      --temperature 0 --prompt "$prompt" >"$log" || { cat "$log"; exit 1; }
    line=$(grep '^prefill ' "$log")
    pre[$s]+="$(sed 's/.*s: \([0-9]*\) tokens\/s;.*/\1/' <<<"$line") "
    dec[$s]+="$(sed 's/.*s: \([0-9]*\) tokens\/s$/\1/' <<<"$line") "
    echo "round $((r + 1)) generate, $s: $line" >&2
  done
  for ((k = 0; k < ${#SETUPS[@]}; k++)); do
    s=${SETUPS[(k + r) % ${#SETUPS[@]}]}
    log="$WORK/train-${s// /_}-$r.log"
    run "$s" --config "$CONFIG,context=$TRAIN_CONTEXT" --steps "$TRAIN_STEPS" --batch "$TRAIN_BATCH" \
      --log-every "$((TRAIN_STEPS / 2))" >"$log" || { cat "$log"; exit 1; }
    tps=$(grep '^step' "$log" | tail -1 | sed 's/.*tokens\/s //')
    trn[$s]+="$tps "
    echo "round $((r + 1)) train, $s: $tps tokens/s" >&2
  done
done

echo
echo "generation: batch $SAMPLES, prompt $PROMPT_BYTES tokens, $NEW new (prefill + $((NEW - 1)) decode steps), greedy;"
echo "training: batch $TRAIN_BATCH x context $TRAIN_CONTEXT, tokens/s of steps $((TRAIN_STEPS / 2 + 1))-$TRAIN_STEPS;"
echo "medians of $ROUNDS rounds (every round's figure in brackets), ratio to unsharded"
printf '%-20s %-30s %-30s %-30s\n' setup "prefill tokens/s" "decode tokens/s" "training tokens/s"
for s in "${SETUPS[@]}"; do
  cell() {
    local -n arr=$1
    local m b
    m=$(median "${arr[$s]}")
    b=$(median "${arr[unsharded]}")
    echo "$m [${arr[$s]% }] x$(ratio "$m" "$b")"
  }
  printf '%-20s %-30s %-30s %-30s\n' "$s" "$(cell pre)" "$(cell dec)" "$(cell trn)"
done
echo
# With --load-weights the example builds the model without parameter memory
# (nn::DeferredInit): each rank allocates its shards when the plan cuts them,
# an unsharded run its parameters as the load fills them.
echo "resident memory (MiB; round 1; 'peak since start': everything before the load, 'during': the load's own peak):"
for s in "${SETUPS[@]}"; do
  grep -h '^rank.*: memory ' "$WORK/gen-${s// /_}-0.log" | sed "s/^/  $s, /"
done
# The examples keep freed memory in the heap (models/heap.h), so what a
# step freed stays resident; given back, RSS shows what the process holds.
# The caches are sized for the whole context at once, so a shorter
# generation peaks alike.
echo "the same with MALLOC_TRIM_THRESHOLD_=0 (freed memory given back), --generate 16:"
for s in "${SETUPS[@]}"; do
  log="$WORK/trimmed-${s// /_}.log"
  MALLOC_TRIM_THRESHOLD_=0 SHARDPLAN_REPORT_MEMORY=1 run "$s" --steps 0 --load-weights "$weights" --generate 16 \
    --samples "$SAMPLES" --temperature 0 --prompt "$prompt" >"$log" || { cat "$log"; exit 1; }
  grep -h '^rank.*: memory ' "$log" | sed "s/^/  $s, /"
done

echo
echo "load time, mmap-slice vs tensor-whole vs file-whole ($LOAD_REPS interleaved reps after one untimed of each):"
for n in 1 2; do
  plan_opt=()
  ((n == 1)) || plan_opt=(--plan "$PLAN")
  echo "\$ bench_llama_load --ranks $n ${plan_opt[*]}"
  "$LOAD" --weights "$weights" --ranks "$n" --reps "$LOAD_REPS" "${plan_opt[@]}" 2>&1 |
    sed 's/^/  /'
done
for n in 2 4; do
  echo "\$ shardplan launch -n $n --backend gloo -- bench_llama_load"
  "$CLI" launch -n "$n" --backend gloo -- "$LOAD" --weights "$weights" --plan "$PLAN" --reps "$LOAD_REPS" 2>&1 |
    sed -n 's/^\[rank 0\] //p' | sed 's/^/  /'
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); $((SECONDS - start)) s"
