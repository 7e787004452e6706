#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a
# while: scripts/fuzz.sh [SECONDS per target, default 600] [TARGET...]
# CI runs it for a few seconds per target; run it longer by hand after
# touching a parser. Crashes land in build-fuzz/crashes/ with the input that
# caused them (replay: build-fuzz/<target> build-fuzz/crashes/<file>).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(plan_fuzzer checkpoint_meta_fuzzer safetensors_header_fuzzer
                                     zip_reader_fuzzer pickle_reader_fuzzer hf_config_fuzzer
                                     hf_config_gpt2_fuzzer tokenizer_json_fuzzer)
out=${SHARDPLAN_FUZZ_BUILD:-build-fuzz}

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; run scripts/setup-deps.sh" >&2
  exit 1
fi
cmake -S tests/fuzz -B "$out" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$out" -j2 --target "${targets[@]}"

mkdir -p "$out/crashes"
# Binary seeds (torch.save zips, pickles) are generated, not checked in.
python3 tests/fuzz/make_seeds.py "$out/seeds"
for t in "${targets[@]}"; do
  corpus="$out/corpus/$t"
  mkdir -p "$corpus"
  seeds=()
  case "$t" in
    plan_fuzzer) seeds=(plans tests/fuzz/plans) ;;
    *) [ -d "tests/fuzz/$t" ] && seeds=("tests/fuzz/$t")
       [ -d "$out/seeds/$t" ] && seeds+=("$out/seeds/$t") ;;
  esac
  echo "fuzz: $t for ${seconds}s (corpus $corpus, seeds ${seeds[*]:-none})" >&2
  # -timeout: an input taking over 10 s counts as a hang; -rss_limit_mb: as a leak.
  "$out/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -artifact_prefix="$out/crashes/$t-" -print_final_stats=1 "$corpus" "${seeds[@]}"
done
