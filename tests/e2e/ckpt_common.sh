# Sourced by the checkpoint e2e scripts (`source ckpt_common.sh NAME`):
# WORK, a temporary directory removed on exit; fail MESSAGE, which prints
# the tail of every $WORK/*.log; run NAME CMD..., which logs to
# $WORK/NAME.log; same_losses REFERENCE_LOG CHAIN_LOG STEPS; and an
# environment without a launcher's variables, so the scripts' own launches
# start clean.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do
    [[ -e $f ]] || continue
    echo "--- $(basename "$f") (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT SHARDPLAN_BACKEND SHARDPLAN_STORE \
  SHARDPLAN_TEST_CKPT_PAUSE_MS
run() {  # run NAME CMD...
  local name=$1
  shift
  "$@" >"$WORK/$name.log" 2>&1 || fail "$name: exit status $?"
}
losses() { sed -E 's/^\[rank [0-9]+\] //' "$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4}'; }
# Every step of CHAIN_LOG has REFERENCE_LOG's loss (1e-9 relative), and
# STEPS steps were compared.
same_losses() {
  local n
  n=$(join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) | awk '
    { d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > 1e-9 * s) { print "step " $1 ": " $2 " vs " $3 > "/dev/stderr"; bad = 1 } n++ }
    END { print n; exit bad }') || fail "the resumed chain's losses differ from the uninterrupted run"
  [[ $n -eq $3 ]] || fail "compared $n steps, expected $3"
}
