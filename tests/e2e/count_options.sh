#!/usr/bin/env bash
# A count option given what is not a whole number in its range ("1e9",
# "3x", "-1", past 2^63, empty) is refused before anything runs: a non-zero
# exit and the one line "OPTION must be an integer from LO to HI, got
# 'VALUE'" (shardplan/count_option.h), no backtrace. std::stoi read "1e9"
# as 1: train_script --steps 1e9 trained one step and exited 0.
# usage: count_options.sh OPTION COMMAND...  (COMMAND gets "OPTION VALUE"
#        appended, or, where an argument is {}, VALUE put there: a
#        positional count, which OPTION then names)
set -uo pipefail
option=$1
shift
failures=0
for bad in 1e9 3x -1 99999999999999999999 ''; do
  cmd=() placed=0
  for a in "$@"; do
    if [ "$a" = "{}" ]; then cmd+=("$bad") placed=1; else cmd+=("$a"); fi
  done
  ((placed)) || cmd+=("$option" "$bad")
  out=$("${cmd[@]}" 2>&1 </dev/null)
  rc=$?
  lines=$(grep -cF -- "$option must be an integer from " <<<"$out")
  if [ $rc -eq 0 ] || [ "$lines" != 1 ] || ! grep -qF -- ", got '$bad'" <<<"$out" ||
    grep -qiE "terminate called|exception raised from|^step +1 " <<<"$out"; then
    echo "FAIL ${cmd[*]}: exit $rc, expected one line naming $option and '$bad':"
    echo "$out" | head -20
    failures=$((failures + 1))
  else
    echo "ok   '$bad': $(grep -F -- "$option must be" <<<"$out")"
  fi
done
exit $((failures > 0))
