#!/bin/bash
# Runs on the lent machine, from the repository root's copy there, what
# scripts/lent-machine/bundle.sh packed: the benchmarks that need cores to
# spare and the NCCL plugin's GPU tests (README.md beside this file).
#
#   bash .devrun/run.sh [SECTION...]     # smoke nccl dp async gpt script recompute pipe (default: all)
#
# Results go to $OUT (the device tool's folder), one file per run, and to
# stdout. Each run has its own timeout, so one that hangs costs only itself.
set -u
cd "$(dirname "$0")/.."
R=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SECTIONS=${*:-smoke nccl dp async gpt script recompute pipe}
log() { echo "### $*"; }
log "host $(getconf _NPROCESSORS_ONLN) cores, $(ldd --version | head -1), kernel $(uname -r), $(date -u)"
log "load $(cut -d' ' -f1-3 /proc/loadavg); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
log "cgroup cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo n/a); affinity $(nproc) cpus"
L=/tmp/shardplan-libs
if [ ! -e $L/done ]; then
  mkdir -p $L
  if command -v xz >/dev/null; then tar -C $L -xJf .devrun/deps.tar.xz
  else python3 -c "import tarfile; tarfile.open('.devrun/deps.tar.xz').extractall('$L')"; fi
  cp .devrun/stubs/* $L/ && touch $L/done || { echo "run.sh: unpacking the libraries failed"; exit 3; }
fi
export LD_LIBRARY_PATH=$L
# The build baked its source folder into the binaries (the example corpus,
# the NCCL tests' plugin path): make it lead here.
SRC=$(cat .devrun/source_dir)
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$R" "$SRC"; }
[ -e build ] || ln -s .devrun build
B=build/bin

for s in $SECTIONS; do
case $s in
smoke)
  log smoke
  timeout 60 $B/bench_async_tp --threads 2 --rounds 1 --steps 1 --sizes 256x64 2>&1 | tee $OUT/smoke.txt
  timeout 60 $B/shardplan launch -n 2 --backend gloo -- $B/bench_async_tp --rounds 1 --steps 1 --sizes 256x64 2>&1 |
    tee -a $OUT/smoke.txt
  ;;
nccl)
  log "nccl (world size 1: one GPU)"
  ND=$(find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -1)
  CD=$(find /usr/local/cuda*/ /opt -name 'libcudart.so.13' 2>/dev/null | head -1)
  echo "nccl: $ND, cudart: $CD"
  [ -n "$ND" ] && grep -a -o -m1 "NCCL version [0-9][0-9.+a-z]*" "$(readlink -f "$ND")"
  LD_LIBRARY_PATH=$L:$(dirname "$ND"):$(dirname "$CD") timeout 90 $B/comm_nccl_tests \
    --gtest_filter='NcclPlugin.*:NcclWorld1.*' 2>&1 | tee $OUT/nccl.txt | tail -25
  LD_LIBRARY_PATH=$L:$(dirname "$ND"):$(dirname "$CD") timeout 60 $B/bench_comm_nccl --iters 200 2>&1 |
    tee $OUT/bench_nccl.txt
  ;;
dp)
  # Issue 10: data-parallel overlap with cores to spare for gloo's threads.
  # DP_BATCHES: global batches, one run each (fewer tokens per step make the
  # gradient sync a larger share of the step); DP_ARGS: more bench options.
  export SHARDPLAN_NUM_THREADS=${DP_THREADS:-2} OMP_NUM_THREADS=${DP_THREADS:-2} OPENBLAS_NUM_THREADS=${DP_THREADS:-2}
  for b in ${DP_BATCHES:-16}; do
    log "dp_step, gloo TCP, ${DP_THREADS:-2} threads per rank, global batch $b"
    SHARDPLAN_GLOO_SHM=off timeout ${DP_TIMEOUT:-240} benchmarks/dp_step/run.sh build -- --rounds ${DP_ROUNDS:-41} \
      --steps 1 --batch $b ${DP_ARGS:-} 2>&1 | grep -v "bucket [0-9]\|warning" | tee $OUT/dp_tcp_b$b.txt
  done
  unset SHARDPLAN_NUM_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS
  ;;
async)
  # Issue 11: rings against collectives, dense pair.
  SZ=${ASYNC_SIZES:-256x64,1024x128,8192x64,4096x256,4096x512}
  A="--rounds ${ASYNC_ROUNDS:-11} --steps 2 --sizes $SZ"
  log "async, gloo TCP, 2 ranks x 4 threads"
  SHARDPLAN_GLOO_SHM=off SHARDPLAN_NUM_THREADS=4 timeout 150 $B/shardplan launch -n 2 --backend gloo -- \
    $B/bench_async_tp $A 2>&1 | tee $OUT/async_tcp2.txt
  log "async, gloo TCP, 4 ranks x 3 threads"
  SHARDPLAN_GLOO_SHM=off SHARDPLAN_NUM_THREADS=3 timeout 150 $B/shardplan launch -n 4 --backend gloo -- \
    $B/bench_async_tp $A 2>&1 | grep -v warning | tee $OUT/async_tcp4.txt
  ;;
gpt)
  log "async, GPT, gloo TCP, 2 ranks x 4 threads"
  SHARDPLAN_GLOO_SHM=off SHARDPLAN_NUM_THREADS=4 timeout 120 $B/shardplan launch -n 2 --backend gloo -- \
    $B/bench_async_tp --model gpt --rounds ${GPT_ROUNDS:-9} --steps 1 --sizes ${GPT_SIZES:-512x128,2048x256,2048x512} 2>&1 |
    tee $OUT/async_gpt.txt
  ;;
script)
  # Issue 21: the TorchScript GPT under a plan against the shardplan::nn GPT,
  # 2 thread ranks, with cores to spare (threads per rank: cores / 2).
  for m in .devrun/models/*.pt; do
    log "bench_script $(basename "$m")"
    timeout ${SCRIPT_TIMEOUT:-200} $B/bench_script --model "$m" --runs ${SCRIPT_RUNS:-7} 2>&1 |
      tee $OUT/script_$(basename "$m" .pt).txt
  done
  ;;
recompute)
  # Issue 35: activation recomputation's step time on a quiet machine, at the
  # bench's default sizes and at a wider model (REC_ARGS: more options).
  for m in gpt llama; do
    log "bench_recompute $m, default sizes"
    timeout ${REC_TIMEOUT:-150} $B/bench_recompute --model $m --reps ${REC_REPS:-9} ${REC_ARGS:-} 2>&1 |
      tee $OUT/recompute_$m.txt
  done
  log "bench_recompute gpt, embed 1024"
  timeout ${REC_TIMEOUT:-150} $B/bench_recompute --model gpt --reps ${REC_REPS:-9} --ranks 1,2 \
    --gpt context=256,embed=1024,heads=16,layers=2,mlp=4096,dropout=0.1 ${REC_ARGS:-} 2>&1 | tee $OUT/recompute_gpt1024.txt
  ;;
pipe)
  # Issue 36: the pipeline schedules' bubble against theory with a core per
  # stage to spare (PIPE_THREADS per rank): thread ranks, then gloo processes
  # over TCP. About a minute.
  export SHARDPLAN_NUM_THREADS=${PIPE_THREADS:-2}
  log "bench_pipeline, thread ranks, ${PIPE_THREADS:-2} threads per rank"
  timeout ${PIPE_TIMEOUT:-120} $B/bench_pipeline --pipes 2,4 --micro ${PIPE_MICRO:-4,8,16} --steps ${PIPE_STEPS:-9} \
    --check 1 ${PIPE_ARGS:-} 2>&1 | tee $OUT/pipe_threads.txt
  for n in 2 4; do
    log "bench_pipeline, $n gloo processes (TCP)"
    SHARDPLAN_GLOO_SHM=off timeout ${PIPE_TIMEOUT:-120} $B/shardplan launch -n $n --backend gloo -- $B/bench_pipeline \
      --micro ${PIPE_MICRO:-4,8,16} --steps ${PIPE_STEPS:-9} --check 1 ${PIPE_ARGS:-} 2>&1 |
      grep -v warning |
      tee $OUT/pipe_gloo$n.txt
  done
  unset SHARDPLAN_NUM_THREADS
  ;;
*) echo "run.sh: unknown section '$s' (smoke nccl dp async gpt script recompute pipe)" ;;
esac
done
log "done $(date -u); load $(cut -d' ' -f1-3 /proc/loadavg)"
