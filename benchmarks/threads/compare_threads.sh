#!/usr/bin/env bash
# One rank on all of this machine's cores: which split between libtorch's
# intra-op pool (OpenMP) and OpenBLAS's pool trains fastest? libtorch's
# OpenMP threads each call into OpenBLAS, whose own pool then runs beside
# them, so the two sizes multiply (docs/THREADS.md). Runs the GPT example
# with every split interleaved (the machine is shared and noisy: each
# repetition visits every setting once), for float32 and float64 and a small
# and a large model, and prints tokens/s (best and median of the runs) and
# the best run's ratio to the best setting's.
#
# usage: compare_threads.sh [BUILD_DIR] [REPETITIONS] [STEPS]
#   (defaults: build, 3, 100; the large model runs STEPS / 2: each timed
#   window lasts seconds, not the fraction of one that let noise decide)
# Exit status 1 when the default is more than 10 % below the best setting
# of some case (the bar of issue 23).
set -euo pipefail
build=${1:-build}
reps=${2:-3}
steps=${3:-100}
gpt="$build/examples/train_gpt"
[[ -x $gpt ]] || { echo "compare_threads.sh: no $gpt (build the examples first)" >&2; exit 2; }
n=$(nproc)
# name|environment (empty: the default, nothing set)
settings=("default|" "intra1-blas1|SHARDPLAN_NUM_THREADS=1"
  "intra1-blas$n|SHARDPLAN_NUM_THREADS=1 OPENBLAS_NUM_THREADS=$n"
  "intra$n-blas1|SHARDPLAN_NUM_THREADS=$n OPENBLAS_NUM_THREADS=1"
  "intra$n-blas$n|SHARDPLAN_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n")
# name|steps divisor|options
cases=("float32 small|1|--dtype float32" "float64 small|1|--dtype float64"
  "float32 large|2|--dtype float32 --config embed=384,heads=6,layers=2,mlp=1536 --batch 8"
  "float64 large|2|--dtype float64 --config embed=384,heads=6,layers=2,mlp=1536 --batch 8")
declare -A runs
for ((r = 1; r <= reps; r++)); do
  for c in "${cases[@]}"; do
    # Each repetition starts at another setting: the first run after a model
    # change came out slower, whatever its setting.
    for ((k = 0; k < ${#settings[@]}; k++)); do
      s=${settings[(k + r) % ${#settings[@]}]}
      # The tokens/s of the second half: the first steps warm the allocator up.
      rest=${c#*|}
      n_steps=$((steps / ${rest%%|*}))
      # shellcheck disable=SC2086
      line=$(env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u SHARDPLAN_NUM_THREADS ${s#*|} \
        "$gpt" ${rest#*|} --steps "$n_steps" --log-every "$((n_steps / 2))" 2>&1 | grep '^step' | tail -1)
      tps=${line##*tokens/s }
      runs["${c%%|*}|${s%%|*}"]+="$tps "
      echo "rep $r  ${c%%|*}  ${s%%|*}: $tps tokens/s" >&2
    done
  done
done
echo "cores: $n; train_gpt --steps $steps (large: $((steps / 2))), tokens/s of the second half, $reps interleaved runs"
echo "default: what train_gpt does with no --threads (now intra-op 1, BLAS $n)"
# Interference on a shared machine only ever slows a run down, so the best
# of the runs is the figure to compare (the median is printed beside it).
printf '%-15s %-18s %9s %9s %8s\n' case setting best median vs-best
bad=0
for c in "${cases[@]}"; do
  cname=${c%%|*}
  declare -A top=() mid=()
  best=0
  for s in "${settings[@]}"; do
    sname=${s%%|*}
    sorted=$(tr ' ' '\n' <<<"${runs[$cname|$sname]}" | grep . | sort -n)
    top[$sname]=$(tail -1 <<<"$sorted")
    mid[$sname]=$(awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' <<<"$sorted")
    ((top[$sname] > best)) && best=${top[$sname]}
  done
  for s in "${settings[@]}"; do
    sname=${s%%|*}
    ratio=$(awk -v a="${top[$sname]}" -v b="$best" 'BEGIN {printf "%.2f", a / b}')
    printf '%-15s %-18s %9s %9s %8s\n' "$cname" "$sname" "${top[$sname]}" "${mid[$sname]}" "$ratio"
    if [[ $sname == default ]] && awk -v r="$ratio" 'BEGIN {exit !(r < 0.90)}'; then bad=1; fi
  done
done
((bad == 0)) || { echo "the default is more than 10 % below the best setting in some case" >&2; exit 1; }
