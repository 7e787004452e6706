# Sourced by tests that feed train_model bad input (weights_hostile_config.sh,
# family_bad_config.sh). one_line_error NAME RC ERR_FILE WANT...: the run
# exited 1 with one line on stderr (ERR_FILE) holding every WANT; otherwise
# says why and counts a failure in $failures. Returns 1 when it failed.
one_line_error() {
  local name=$1 rc=$2 err=$3 lines
  shift 3
  lines=$(grep -c . "$err")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL $name: exit $rc (want 1), $lines lines on stderr (want 1):"; cat "$err"
    failures=$((failures + 1)); return 1
  fi
  local w ok=0
  for w in "$@"; do
    grep -qF -- "$w" "$err" || { echo "FAIL $name: no '$w' in: $(cat "$err")"; failures=$((failures + 1)); ok=1; }
  done
  return $ok
}
