# Sourced by llama_weights.sh and llama_logits.sh: the Python reference
# (tests/llama/reference.py, skipped with 77 without Debian's python3-torch),
# the prompt both sides continue, and how a train_model run's greedy text is
# read and checked. The caller sets $train (train_model) and $work.
py=/usr/bin/python3
if ! $py -c "import torch, numpy" 2>/dev/null; then
  echo "skipped: $py cannot import torch (Debian's python3-torch)"
  exit 77
fi
ref=$(dirname "${BASH_SOURCE[0]}")/../llama/reference.py
prompt="From fairest creatures"
n=12
failures=0

# gen [LAUNCHER... --] ARGS...: the greedy text (float64 unless ARGS say
# otherwise) of train_model --steps 0 ARGS, run under LAUNCHER when given
# (shardplan launch ... --, whose "[rank 0] " prefix is dropped); the output
# stays in $work/out.txt.
gen() {
  local launcher=()
  if [[ " $* " == *" -- "* ]]; then
    while (($#)) && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
    shift
  fi
  "${launcher[@]}" "$train" --model llama --steps 0 --generate $n --temperature 0 --samples 1 --dtype float64 \
    --prompt "$prompt" "$@" >"$work/out.txt" 2>&1 || { cat "$work/out.txt"; return 1; }
  sed -n 's/^\(\[rank 0\] \)\{0,1\}sample 1: "\(.*\)"$/\2/p' "$work/out.txt"
}

check() {  # what expected got
  if [ "$2" = "$3" ]; then
    echo "ok   $1: $3"
  else
    echo "FAIL $1: expected '$2', got '$3'"
    failures=$((failures + 1))
  fi
}

# at_most A B: whether the number A is at most B.
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

# within WHAT BOUND LINE: LINE is reference.py logits' "DIFFERENCE FILE";
# the difference must be at most BOUND.
within() {
  local d=${3%% *}
  if at_most "$d" "$2"; then
    echo "ok   $1: logits max |C++ - Python float64| $d <= $2"
  else
    echo "FAIL $1: logits max |C++ - Python float64| $d > $2"
    failures=$((failures + 1))
  fi
}
