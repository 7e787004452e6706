#!/usr/bin/env bash
# Packs a build for the lent GPU machine (scripts/lent-machine/README.md):
# .devrun/ with the binaries run.sh uses, libshardplan and its plugins, the
# Debian libraries they need (deps.tar.xz) and stand-ins for those never
# called (stubs/). About 50 MB; git ignores it (.git/info/exclude).
#
#   scripts/lent-machine/bundle.sh [BUILD_DIR]     # then: device run, carry [".devrun"]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
D=.devrun
BINS=(shardplan bench_async_tp bench_dp_step comm_nccl_tests bench_comm_nccl bench_script bench_recompute bench_pipeline)
for b in "${BINS[@]}"; do
  [[ -x $BUILD/bin/$b ]] || { echo "bundle.sh: $BUILD/bin/$b is missing (scripts/build.sh)" >&2; exit 2; }
done
grep -qx '/.devrun/' "$(git rev-parse --git-path info/exclude)" 2>/dev/null ||
  echo '/.devrun/' >>"$(git rev-parse --git-path info/exclude)"
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib/shardplan/plugins"
for b in "${BINS[@]}"; do cp "$BUILD/bin/$b" "$D/bin/"; done
cp -a "$BUILD"/lib/libshardplan.so* "$D/lib/"
# MPI stays behind: mpirun and Open MPI's own plugins would have to travel too.
for p in "$BUILD"/lib/shardplan/plugins/*.so; do
  [[ $p == *comm_mpi* ]] || cp "$p" "$D/lib/shardplan/plugins/"
done
strip --strip-unneeded "$D"/bin/* "$D"/lib/*.so* "$D"/lib/shardplan/plugins/*.so
python3 scripts/lent-machine/libs.py "$D" "$D"/bin/* "$D"/lib/libshardplan.so.* "$D"/lib/shardplan/plugins/*.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
xargs -a "$D/keep.txt" cp -L -t "$tmp/"
tar -C "$tmp" -cf - . | xz -T2 -6 >"$D/deps.tar.xz"
cp scripts/lent-machine/run.sh "$D/run.sh"
# The TorchScript GPTs bench_script trains (run.sh script): that machine has
# no python torch to export them.
mkdir -p "$D/models"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 examples/export_script_gpt.py "$D/models/gpt128.pt" --embed 128 --context 64
  /usr/bin/python3 examples/export_script_gpt.py "$D/models/gpt64.pt"
fi
# The source folder the build baked into the binaries (corpus, NCCL plugin path).
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" >"$D/source_dir"
du -sh "$D"
