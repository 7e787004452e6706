# Sourced by the e2e scripts that compare two commands' output
# (losses_match.sh, generation_match.sh).
#   split_commands USAGE "$@"   "-- REFERENCE... -- COMMAND..." into the arrays
#                               ref and cmd (exits 2 with USAGE otherwise)
#   run NAME COMMAND...         runs it into $work/NAME; on failure prints the
#                               output and exits 1
# $work is a directory removed on exit.
split_commands() {
  local usage=$1; shift
  [ "${1:-}" = "--" ] || { echo "usage: $usage" >&2; exit 2; }
  shift
  ref=(); while (($#)) && [ "$1" != "--" ]; do ref+=("$1"); shift; done
  shift
  cmd=("$@")
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {
  local name=$1; shift
  "$@" >"$work/$name" 2>&1 || { echo "$name command failed: $*"; cat "$work/$name"; exit 1; }
}
