#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian 12 machine: packages,
# build, then every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
bash scripts/build.sh
ctest --test-dir "${SHARDPLAN_BUILD_DIR:-build}" --output-on-failure -j2 "$@"
