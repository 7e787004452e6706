#!/usr/bin/env bash
# ASan + UBSan build of everything (gcc) and the test suite under it:
#   scripts/sanitize.sh [--ci] [ctest arguments...]   e.g. -R Checkpoint, -L launcher
# --ci (what .ci/run uses, to stay within CI's time): builds only the unit
# test binary and what it loads (plugins, the ckpt tool) and runs it: every
# layer, parity, checkpoint, plan, agreement and comm-through-framework test,
# under the sanitizers. The script without --ci builds everything and runs
# the whole ctest suite (launcher, e2e, MPI, bench and fault tests too);
# docs/HARDENING.md has its last result.
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
source "$supp/env.sh"
if [ "${1:-}" = "--ci" ]; then
  shift
  cmake --build "$dir" -j2 --target shardplan_tests
  "$dir/bin/shardplan_tests" --gtest_brief=1 "$@"
  exit
fi
cmake --build "$dir" -j2
ctest --test-dir "$dir" --output-on-failure -j2 "$@"
