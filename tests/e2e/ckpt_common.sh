# Sourced by the checkpoint e2e scripts (`source ckpt_common.sh NAME`):
# WORK, a temporary directory removed on exit; fail MESSAGE, which prints
# the tail of every $WORK/*.log; and an environment without a launcher's
# variables, so the scripts' own launches start clean.
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
