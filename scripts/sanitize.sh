#!/usr/bin/env bash
# ASan + UBSan build of everything (gcc) and the test suite under it:
#   scripts/sanitize.sh [--ci] [ctest arguments...]   e.g. -R Checkpoint, -L launcher
# --ci (what .ci/run uses, to stay within CI's time): every test except the
# repeats of the conformance suites at more world sizes and the bench dtype
# variants, which run the same code of ours again (under ASan the MPI ones
# take 1.5 min each); not combinable with -E.
# Builds in build-asan (or $SHARDPLAN_ASAN_BUILD_DIR). Any report fails the
# test that produced it. Suppressed findings, each with its reason, are in
# tests/sanitize/; docs/HARDENING.md explains the setup.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SHARDPLAN_ASAN_BUILD_DIR:-build-asan}
supp=$PWD/tests/sanitize

# -O1 -g1: ASan's recommended optimisation, line tables for the stack traces,
# and assertions left on.
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DSHARDPLAN_SANITIZE=address,undefined >/dev/null
cmake --build "$dir" -j2

ci=()
if [ "${1:-}" = "--ci" ]; then
  shift
  ci=(-E '^(comm_mpi_(mpirun|launch)_np[134]|comm_gloo_(threads_ws|procs_np)[34]|bench_comm_check_(float16|bfloat16|int8|3_ranks))$')
fi
source "$supp/env.sh"
ctest --test-dir "$dir" --output-on-failure -j2 "${ci[@]}" "$@"
