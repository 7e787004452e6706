#!/usr/bin/env bash
# One rank on all of this machine's cores: which split between libtorch's
# intra-op pool (OpenMP) and OpenBLAS's pool trains fastest? libtorch's
# OpenMP threads each call into OpenBLAS, whose own pool then runs beside
# them, so the two sizes multiply (docs/THREADS.md). Runs the GPT example
# with every split interleaved (the machine is shared and noisy: each
# repetition visits every setting once), for float32 and float64 and a small
# and a large model, and prints tokens/s and the ratio to the best setting.
#
# usage: compare_threads.sh [BUILD_DIR] [REPETITIONS] [STEPS]
#   (defaults: build, 3, 30)
# Exit status 1 when the default is more than 10 % below the best setting
# of some case (the bar of issue 23).
set -euo pipefail
build=${1:-build}
reps=${2:-3}
steps=${3:-30}
gpt="$build/examples/train_gpt"
[[ -x $gpt ]] || { echo "compare_threads.sh: no $gpt (build the examples first)" >&2; exit 2; }
n=$(nproc)
half=$((steps / 2))
# name|environment (empty: the default, nothing set)
settings=("default|" "intra1-blas1|SHARDPLAN_NUM_THREADS=1"
  "intra1-blas$n|SHARDPLAN_NUM_THREADS=1 OPENBLAS_NUM_THREADS=$n"
  "intra$n-blas1|SHARDPLAN_NUM_THREADS=$n OPENBLAS_NUM_THREADS=1"
  "intra$n-blas$n|SHARDPLAN_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n")
cases=("float32 small|--dtype float32" "float64 small|--dtype float64"
  "float32 large|--dtype float32 --config embed=384,heads=6,layers=2,mlp=1536 --batch 8"
  "float64 large|--dtype float64 --config embed=384,heads=6,layers=2,mlp=1536 --batch 8")
declare -A runs
for ((r = 1; r <= reps; r++)); do
  for c in "${cases[@]}"; do
    for s in "${settings[@]}"; do
      # The tokens/s of the second half: the first steps warm the allocator up.
      # shellcheck disable=SC2086
      line=$(env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u SHARDPLAN_NUM_THREADS ${s#*|} \
        "$gpt" ${c#*|} --steps "$steps" --log-every "$half" 2>&1 | grep '^step' | tail -1)
      tps=${line##*tokens/s }
      runs["${c%%|*}|${s%%|*}"]+="$tps "
      echo "rep $r  ${c%%|*}  ${s%%|*}: $tps tokens/s" >&2
    done
  done
done
echo "cores: $n; train_gpt --steps $steps, tokens/s of the last $half steps, median of $reps interleaved runs"
printf '%-15s %-18s %10s %8s\n' case setting tokens/s vs-best
bad=0
for c in "${cases[@]}"; do
  cname=${c%%|*}
  declare -A med=()
  best=0
  for s in "${settings[@]}"; do
    sname=${s%%|*}
    m=$(tr ' ' '\n' <<<"${runs[$cname|$sname]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    med[$sname]=$m
    ((m > best)) && best=$m
  done
  for s in "${settings[@]}"; do
    sname=${s%%|*}
    ratio=$(awk -v a="${med[$sname]}" -v b="$best" 'BEGIN {printf "%.2f", a / b}')
    printf '%-15s %-18s %10s %8s\n' "$cname" "$sname" "${med[$sname]}" "$ratio"
    if [[ $sname == default ]] && awk -v r="$ratio" 'BEGIN {exit !(r < 0.90)}'; then bad=1; fi
  done
done
((bad == 0)) || { echo "the default is more than 10 % below the best setting in some case" >&2; exit 1; }
