#!/usr/bin/env bash
# The test-host fixture's own test (tests/hosts/netns.sh), one case per run:
#   fixture_test.sh reach|rate|cleanup
# reach:   three hosts reach each other by address; the machine's own
#          namespace does not reach them.
# rate:    a 16 Mbit/s tbf makes 2 MB take about a second; unshaped, a
#          fraction of that.
# cleanup: nothing is left after a run ends, is stopped with SIGTERM, or is
#          killed with SIGKILL (then the next run's stale cleanup removes its
#          namespaces and the processes in them).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns.sh"
hosts_require
command -v python3 >/dev/null || { echo "SKIP: the fixture's test needs python3 (tcp_probe.py)" >&2; exit 77; }
PROBE="$HERE/tcp_probe.py"
fail() { echo "FAIL: $*" >&2; exit 1; }

# transfer FROM TO NBYTES: sends NBYTES from host FROM to host TO; prints the
# receiver's line.
transfer() {
  local from=$1 to=$2 nbytes=$3 port=$((5000 + RANDOM % 1000)) out
  out=$(mktemp)
  host_exec "$to" python3 "$PROBE" serve "$(host_addr "$to")" "$port" 10 >"$out" &
  local spid=$!
  host_exec "$from" python3 "$PROBE" send "$(host_addr "$to")" "$port" "$nbytes" 10 ||
    fail "host $from could not send to host $to"
  wait "$spid" || fail "host $to did not receive from host $from: $(cat "$out")"
  cat "$out"
  rm -f "$out"
}
seconds_of() { sed -n 's/^received [0-9]* bytes in \([0-9.]*\) seconds$/\1/p' <<<"$1"; }

case_reach() {
  hosts_up 3 || fail "hosts_up 3"
  local pair line
  for pair in "0 1" "1 2" "2 0"; do
    line=$(transfer $pair 1000) || exit 1
    [[ $line == "received 1000 bytes in "* ]] || fail "hosts $pair: $line"
  done
  # The listener on host 1 must see no connection from outside the hosts.
  local out
  out=$(host_exec 1 python3 "$PROBE" serve "$(host_addr 1)" 5999 2 &
    python3 "$PROBE" send "$(host_addr 1)" 5999 10 1 >/dev/null 2>&1
    wait)
  [[ $out == "nobody connected"* ]] || fail "the machine's own namespace reached host 1: $out"
}

case_rate() {
  local shaped plain
  hosts_up 2 16 || fail "hosts_up 2 16"
  host_exec 0 tc qdisc show dev eth0 | grep -q 'tbf .*rate 16Mbit' || fail "no 16 Mbit tbf on host 0's eth0"
  shaped=$(seconds_of "$(transfer 0 1 2000000)")
  hosts_down
  hosts_up 2 || fail "hosts_up 2"
  plain=$(seconds_of "$(transfer 0 1 2000000)")
  echo "2 MB: ${shaped} s at 16 Mbit/s, ${plain} s unshaped"
  # 2 MB at 16 Mbit/s is 1.0 s, less the bucket's 20 KB head start.
  awk -v s="$shaped" 'BEGIN { exit !(s >= 0.85 && s <= 3) }' || fail "shaped transfer took $shaped s, not about 1 s"
  awk -v s="$shaped" -v p="$plain" 'BEGIN { exit !(p < s / 4) }' || fail "unshaped transfer took $plain s, shaped $shaped s"
}

# run_child HOW: a child bash makes two hosts, starts a sleep on host 0 and
# ends by HOW (exit: it returns normally; TERM, KILL: it gets that signal).
# Prints the child's pid and the sleep's.
run_child() {
  local how=$1 dir pid i sleeper
  dir=$(mktemp -d)
  bash -c '. "$1"; hosts_up 2 || exit 1; host_exec 0 sleep 300 & echo up >"$2/ready"
    while [[ ! -e $2/go ]]; do sleep 0.05; done' _ "$HERE/netns.sh" "$dir" >/dev/null &
  pid=$!
  for ((i = 0; i < 100; i++)); do [[ -s $dir/ready ]] && break; sleep 0.1; done
  [[ -s $dir/ready ]] || fail "the child never brought its hosts up"
  (($(left_by "$pid") == 3)) || fail "no 3 namespaces named after the child $pid"
  for ((i = 0; i < 50; i++)); do sleeper=$(host_pids_of_child "$pid"); [[ -n $sleeper ]] && break; sleep 0.1; done
  [[ -n $sleeper ]] || fail "the child's sleep is not on its host 0"
  case $how in
    exit) touch "$dir/go" ;;
    TERM | KILL) kill "-$how" "$pid" ;;
  esac
  wait "$pid" 2>/dev/null
  rm -rf "$dir"
  echo "$pid $sleeper"
}
host_pids_of_child() { ip netns pids "$(ip netns list | awk '{print $1}' | grep "^$HOSTS_PREFIX-$1-.*-h0$")" 2>/dev/null; }
left_by() { ip netns list | awk '{print $1}' | grep -c "^$HOSTS_PREFIX-$1-"; }

gone() { sleep 0.2; ! kill -0 "$1" 2>/dev/null; }

case_cleanup() {
  local pid sleeper how
  for how in exit TERM; do
    read -r pid sleeper <<<"$(run_child "$how")" || exit 1
    [[ -n $pid ]] || exit 1
    (($(left_by "$pid") == 0)) || fail "namespaces left after $how: $(ip netns list | grep "$pid")"
    gone "$sleeper" || fail "the host's process $sleeper still runs after $how"
  done
  read -r pid sleeper <<<"$(run_child KILL)" || exit 1
  [[ -n $pid ]] || exit 1
  (($(left_by "$pid") == 3)) || fail "a SIGKILLed run should leave its 3 namespaces, found $(left_by "$pid")"
  hosts_clean_stale
  (($(left_by "$pid") == 0)) || fail "stale cleanup left: $(ip netns list | grep "$pid")"
  gone "$sleeper" || fail "stale cleanup left the process $sleeper running"
  echo "nothing left after exit, SIGTERM, and SIGKILL + stale cleanup"
}

case ${1:-} in
  reach | rate | cleanup) "case_$1" ;;
  *) echo "usage: fixture_test.sh reach|rate|cleanup" >&2; exit 2 ;;
esac
