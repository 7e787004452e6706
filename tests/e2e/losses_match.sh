#!/usr/bin/env bash
# Compares the "step N loss X" lines two training commands print (launcher
# prefixes like "[rank 0] " are ignored). Fails if a command fails or prints
# no step.
#
#   losses_match.sh TOL -- REFERENCE... -- COMMAND...
#     each loss within relative tolerance TOL of the reference's (float64
#     runs, where the sharded run must reproduce the unsharded one exactly up
#     to reassociation); where both print "norm X" after the loss (--clip),
#     each norm within TOL relative of the reference's too;
#   losses_match.sh TOL --norms-above X -- ...
#     the same, and every norm of the reference above X (a --clip X that
#     clips at every step);
#
#   losses_match.sh float32 [--expect-mismatch] -- REFERENCE... -- COMMAND...
#     COMMAND trains in float32. A fixed tolerance does not fit float32: summing
#     in another order (sharded partial sums, another CPU's BLAS kernels or
#     thread count) perturbs the losses by rounding, and training amplifies the
#     perturbation step by step, by an amount that depends on the model, the
#     optimiser and the machine. So the bound is measured on this machine for
#     this very run: REFERENCE runs twice more, with --dtype float64 (the exact
#     trajectory, near enough) and --dtype float32; float32 rounding alone moves
#     the unsharded run by e_k = max over steps j <= k of |L32_j - L64_j| / |L64_j|,
#     and COMMAND must stay within
#         |L_k - L64_k| / |L64_k| <= 16 * max(e_k, 2^-23 * k).
#     The factor covers a different but equally legitimate summation order; a
#     wrong gradient (a scale off by 1%, a missing reduction) leaves it within a
#     few steps (see tests/e2e.cmake). --expect-mismatch inverts the verdict
#     (both commands must still succeed): the test that shows the check fails.
#
#   losses_match.sh bfloat16 -- REFERENCE... -- COMMAND...
#     the same for a COMMAND that trains in bfloat16 (it passes --dtype
#     bfloat16 itself): REFERENCE runs with --dtype float64 and --dtype
#     bfloat16, whose spread e_k sets the bound (the floor stays 2^-23 * k:
#     the losses are computed in float32, and a floor of bfloat16's 2^-8 * k
#     would pass anything within a few steps).
set -uo pipefail
mode="$1"; shift
expect_mismatch=0
measured=0
case "$mode" in float32 | bfloat16) measured=1 ;; esac
if ((measured)) && [ "${1:-}" = --expect-mismatch ]; then expect_mismatch=1; shift; fi
above=""
if ((!measured)) && [ "${1:-}" = --norms-above ]; then above=$2; shift 2; fi
. "$(dirname "$0")/two_commands.sh"
split_commands "losses_match.sh TOL|float32|bfloat16 [--expect-mismatch] -- REF... -- CMD..." "$@"
extract() { sed -E 's/^\[rank [0-9]+\] //' "$work/$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4}'; }
# step, loss, and the norm ("-" when the line has none).
extract_norms() {
  sed -E 's/^\[rank [0-9]+\] //' "$work/$1" | awk '$1 == "step" && $3 == "loss" {print $2, $4, ($5 == "norm" ? $6 : "-")}'
}
dump() { for f in "$@"; do echo "--- $f output"; cat "$work/$f"; done; }

if ((!measured)); then
  run reference "${ref[@]}"
  run command "${cmd[@]}"
  paste -d' ' <(extract_norms reference) <(extract_norms command) | awk -v tol="$mode" -v above="$above" '
    function off(a, b,  d, s) { d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; if (s < 1e-30) s = 1e-30; return d / s }
    { n++; a = $2; b = $5; wrong = 0
      if ($1 != $4 || off(a, b) > tol) { wrong = 1; printf "step %s: reference %s, got %s (step %s)\n", $1, a, b, $4 }
      if (($3 == "-") != ($6 == "-")) { wrong = 1; printf "step %s: one command prints a norm, the other not\n", $1 }
      else if ($3 != "-" && off($3, $6) > tol) { wrong = 1; printf "step %s: norm: reference %s, got %s\n", $1, $3, $6 }
      else if ($3 != "-") norms++
      if (above != "" && !($3 != "-" && $3 + 0 > above + 0)) {
        wrong = 1; printf "step %s: the reference norm %s is not above %s\n", $1, $3, above }
      bad += wrong }
    END { if (norms) printf "%d norms equal\n", norms }
    END { if (n == 0) { print "no losses printed"; exit 1 }
          printf "%d passed, %d failed\n", n - bad, bad; exit bad > 0 }' || { dump reference command; exit 1; }
  exit 0
fi

run reference64 "${ref[@]}" --dtype float64
run reference32 "${ref[@]}" --dtype "$mode"
run command "${cmd[@]}"
paste -d' ' <(extract reference64) <(extract reference32) <(extract command) | awk -v expect="$expect_mismatch" -v name="$mode" '
  function abs(x) { return x < 0 ? -x : x }
  { n++; l64 = $2; s = abs(l64); if (s < 1e-30) s = 1e-30
    if ($1 != $3 || $1 != $5) { printf "step numbers differ: %s %s %s\n", $1, $3, $5; broken = 1; exit }
    e = abs($4 - l64) / s; if (e > emax) emax = e
    bound = 16 * (emax > n * 2^-23 ? emax : n * 2^-23)
    d = abs($6 - l64) / s
    if (d > bound) { bad++; if (!first) first = $1 }
    mark = (d > bound) ? "  <-- outside" : ""
    printf "step %s: float64 %s %s %s (%.2e) got %s (%.2e, bound %.2e)%s\n", $1, l64, name, $4, e, $6, d, bound, mark }
  END { if (broken) exit 1
        if (n == 0) { print "no losses printed"; exit 1 }
        if (expect) {
          if (bad) { printf "mismatch detected from step %s, as expected\n", first; print "1 passed, 0 failed"; exit 0 }
          print "the deliberately wrong run stayed within the bound: the check cannot catch it"; exit 1 }
        printf "%d passed, %d failed\n", n - bad, bad; exit bad > 0 }' >"$work/verdict"
rc=$?
cat "$work/verdict"
((rc == 0)) || { dump reference64 reference32 command; exit 1; }
