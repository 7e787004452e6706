#!/usr/bin/env bash
# No source file of the kernel, the plugins or the tools over 600 lines
# (DEVELOPERS.md): a file that long holds more than one concept. Prints each
# offender with its length; exit 1 if there is one.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
limit=600
bad=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  if ((n > limit)); then echo "$f: $n lines (at most $limit: split it along its concepts)"; bad=1; fi
done < <(git ls-files -- framework plugins tools 2>/dev/null || find framework plugins tools -type f)
((bad == 0)) && echo "file sizes: every file in framework/, plugins/, tools/ has at most $limit lines"
exit $bad
