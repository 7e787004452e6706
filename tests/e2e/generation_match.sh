#!/usr/bin/env bash
# Compares the "sample N: ..." lines (generated text) two train_gpt --generate
# commands print (launcher prefixes like "[rank 0] " are ignored): the
# sharded run must generate exactly the unsharded run's text. Fails if a
# command fails, prints no sample or no tokens/s line.
#
#   generation_match.sh -- REFERENCE... -- COMMAND...
set -uo pipefail
. "$(dirname "$0")/two_commands.sh"
split_commands "generation_match.sh -- REF... -- CMD..." "$@"
extract() { sed -E 's/^\[rank [0-9]+\] //' "$work/$1" | grep -E '^sample [0-9]+: '; }
run reference "${ref[@]}"
run command "${cmd[@]}"
extract reference >"$work/ref.txt"
extract command >"$work/cmd.txt"
if [ ! -s "$work/ref.txt" ] || ! grep -q 'tokens/s' "$work/command"; then
  echo "no generated samples or no tokens/s line"; cat "$work/reference" "$work/command"; exit 1
fi
if ! diff "$work/ref.txt" "$work/cmd.txt"; then
  echo "--- the sharded run generated other text; outputs:"; cat "$work/reference" "$work/command"; exit 1
fi
cat "$work/cmd.txt"
grep -E 'key/value cache bytes|tokens/s' "$work/command"
echo "$(wc -l <"$work/ref.txt") samples identical"
