# shellcheck shell=bash
# Helpers shared by the launcher test scripts (launcher_test.sh and
# comm_mpi/launch_mpi_test.sh), which both drive `shardplan launch` with
# launcher_probe as the ranks and check its exit status, output and timing;
# tests/slurm/slurm_env_test.sh uses its clean-up (BG_PIDS, WORK).
# Sourced, not run. The sourcing script sets first:
#   SP         the shardplan binary
#   TEST_NAME  the name FAIL lines carry
#   WORK       a fresh temporary directory; removed on exit, with every
#              process left in BG_PIDS (killed)
# run leaves the launcher's output in $WORK/out and $WORK/err.

BG_PIDS=()
cleanup() {
  local p
  for p in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL [$TEST_NAME]: $*" >&2
  for f in out err; do
    if [[ -s $WORK/$f ]]; then
      echo "--- launcher std$f (first 40 lines):" >&2
      head -n 40 "$WORK/$f" >&2
    fi
  done
  exit 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run ARGS...: runs the launcher; sets RC and ELAPSED_MS, output in $WORK/out, $WORK/err.
run() {
  local start
  start=$(now_ms)
  # A launcher that hangs fails here, with its output, instead of at ctest's timeout.
  timeout -k 5 60 "$SP" "$@" >"$WORK/out" 2>"$WORK/err"
  RC=$?
  ELAPSED_MS=$(($(now_ms) - start))
  [[ $RC -ne 124 && $RC -ne 137 ]] || fail "the launcher was still running after 60 s"
}

expect_rc() { [[ $RC -eq $1 ]] || fail "expected exit status $1, got $RC"; }
expect_empty() { [[ ! -s $WORK/$1 ]] || fail "expected empty std$1"; }
expect_faster_than() { ((ELAPSED_MS < $1)) || fail "took ${ELAPSED_MS} ms, limit $1 ms"; }
# expect_lines FILE EXPECTED: FILE holds exactly the lines of EXPECTED, in any order.
expect_lines() {
  diff <(sort "$1") <(printf '%s\n' "$2" | sort) >"$WORK/diff" ||
    fail "unexpected lines in $(basename "$1") (< got, > expected):
$(cat "$WORK/diff")"
}
# expect_exact FILE EXPECTED: FILE holds exactly the lines of EXPECTED, in order.
expect_exact() {
  diff "$1" <(printf '%s\n' "$2") >"$WORK/diff" ||
    fail "unexpected $(basename "$1") (< got, > expected):
$(cat "$WORK/diff")"
}

# Ranks started with launcher_probe --pidfile "$WORK" write $WORK/rank<N>.pid.
pid_of() { cat "$WORK/$1.pid" 2>/dev/null || fail "no pid file $1.pid"; }
# expect_dead NAME...: the processes of those pid files are gone.
expect_dead() {
  local name pid
  for name in "$@"; do
    pid=$(pid_of "$name")
    if kill -0 "$pid" 2>/dev/null; then
      fail "$name (pid $pid) is still alive after the launcher exited"
    fi
  done
}
# wait_for_files NAME...: waits (20 s at most) until $WORK/NAME exist.
wait_for_files() {
  local deadline=$(($(now_ms) + 20000)) f
  for f in "$@"; do
    while [[ ! -e $WORK/$f ]]; do
      (($(now_ms) < deadline)) || fail "timed out waiting for $f"
      sleep 0.05
    done
  done
}

# expect_probe_lines N: three ranks ran `launcher_probe --lines N --err-lines N`;
# every line of $WORK/out and $WORK/err is whole, prefixed with the rank that
# wrote it, on the right stream, numbered in order, N per rank.
expect_probe_lines() {
  local stream kind
  for stream in out err; do
    kind=line
    [[ $stream == err ]] && kind=err
    awk -v n="$1" -v kind=$kind '
      {
        if (!match($0, /^\[rank [0-2]\] rank [0-2] [a-z]+ [0-9]+ x*$/)) { print "malformed: " $0; bad = 1; exit }
        split($0, f, " ")
        r = f[2]; sub(/\]/, "", r)
        if (f[4] != r || f[5] != kind) { print "wrong rank or stream: " $0; bad = 1; exit }
        if (f[6] != next_line[r] + 0) { print "out of order: " $0; bad = 1; exit }
        if (length(f[7]) != (f[6] * 37) % 151) { print "truncated: " $0; bad = 1; exit }
        next_line[r] = f[6] + 1
      }
      END {
        if (bad) exit 1
        for (r = 0; r < 3; r++) if (next_line[r] != n) { print "rank " r ": " next_line[r] " lines"; exit 1 }
      }' "$WORK/$stream" >"$WORK/awk" || fail "std$stream: $(cat "$WORK/awk")"
  done
}
