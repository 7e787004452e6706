#!/usr/bin/env bash
# Configures and builds shardplan into ./build (or $SHARDPLAN_BUILD_DIR).
# Extra arguments are build targets (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${SHARDPLAN_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
if (($#)); then
  for t in "$@"; do cmake --build "$BUILD_DIR" -j2 --target "$t"; done
else
  cmake --build "$BUILD_DIR" -j2
fi
