#!/usr/bin/env bash
# Each tests/test_X.cpp keeps its code in `namespace test_X { ... }`: the unity
# build (cmake/ShardplanUnity.cmake) joins test files into one translation
# unit, and a file left in the global namespace would meet its neighbours'
# file-local names only once a later file lands in its batch. Prints each
# offender; exit 1 if there is one.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
bad=0
for f in tests/test_*.cpp tests/*/test_*.cpp; do
  [[ $f == tests/comm_nccl/* ]] && continue  # its own binary (comm_nccl_tests), not in the unity build
  stem=$(basename "$f" .cpp)
  if ! grep -q "^namespace $stem {" "$f" || ! grep -q "^}  // namespace $stem\$" "$f"; then
    echo "$f: put its code in 'namespace $stem {' ... '}  // namespace $stem' (after the #includes)"
    bad=1
  fi
done
((bad == 0)) && echo "test namespaces: every tests/test_*.cpp and tests/<concept>/test_*.cpp keeps its code in its own namespace"
exit $bad
