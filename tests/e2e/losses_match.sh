#!/usr/bin/env bash
# losses_match.sh TOL -- REFERENCE COMMAND... -- COMMAND...
# Runs both commands and checks that they print the same "step N loss X"
# lines (launcher prefixes like "[rank 0] " are ignored), each loss within
# relative tolerance TOL. Fails if either command fails or prints no step.
set -uo pipefail
tol="$1"; shift
[ "$1" = "--" ] || { echo "usage: losses_match.sh TOL -- REF... -- CMD..." >&2; exit 2; }
shift
ref=(); while (($#)) && [ "$1" != "--" ]; do ref+=("$1"); shift; done
shift
cmd=("$@")
out_ref=$(mktemp); out_cmd=$(mktemp)
trap 'rm -f "$out_ref" "$out_cmd"' EXIT
"${ref[@]}" >"$out_ref" 2>&1 || { echo "reference command failed:"; cat "$out_ref"; exit 1; }
"${cmd[@]}" >"$out_cmd" 2>&1 || { echo "command failed:"; cat "$out_cmd"; exit 1; }
extract() { sed -E 's/^\[rank [0-9]+\] //' "$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4}'; }
paste -d' ' <(extract "$out_ref") <(extract "$out_cmd") | awk -v tol="$tol" '
  { n++; a = $2; b = $4; d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; if (s < 1e-30) s = 1e-30;
    if ($1 != $3 || d / s > tol) { bad++; printf "step %s: reference %s, got %s (step %s)\n", $1, a, b, $3 } }
  END { if (n == 0) { print "no losses printed"; exit 1 }
        printf "%d passed, %d failed\n", n - bad, bad; exit bad > 0 }' || {
  echo "--- reference output"; cat "$out_ref"; echo "--- output"; cat "$out_cmd"; exit 1; }
