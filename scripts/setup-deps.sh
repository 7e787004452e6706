#!/usr/bin/env bash
# Installs every Debian package shardplan needs to build, test and run.
# Idempotent: when everything is present it changes nothing and needs no network.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache git
  libtorch-dev            # libtorch (CPU) and c10d's FileStore
  libopenblas0-pthread    # libtorch on reference BLAS is ~15x slower
  libgloo-dev             # gloo communication plugin
  libyaml-cpp-dev         # plan parser
  nlohmann-json3-dev      # safetensors headers and indexes (weights)
  libre2-dev              # plan patterns and weight renames: linear-time regexes (base/ecma_regex.h)
  libsentencepiece-dev    # SentencePiece tokenizer.model (examples/models/tokenizer/)
  libicu-dev              # Unicode NFC, tokenizer.json normalizer (Qwen2; examples/models/tokenizer/)
  python3-sentencepiece   # its reference in tests/sentencepiece_reference.py
  python3-regex           # tests/tokenizer_reference.py checks its pattern scanner against it
  libboost-dev            # Boost.DLL plugin loading (header-only with std::filesystem)
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  iproute2                # multi-node tests bind ranks to other loopback addresses
  procps util-linux       # pgrep and prlimit: restart and larger-than-one-rank tests
  gnuplot-nox             # shardplan bench comm --plot
  clang libclang-rt-14-dev # libFuzzer targets (scripts/fuzz.sh): clang++ and libclang_rt.fuzzer
  llvm                    # llvm-symbolizer: file:line in libFuzzer's crash reports
  python3-torch           # the PyTorch/ProcessGroupGloo peer of the GPT benchmark (benchmarks/gpt_peer, gpt_peer_smoke)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
