# Test hosts on one machine: N network namespaces ("hosts"), each with one
# interface eth0 and the address 10.99.0.<i+1>/24, all plugged into a bridge
# that lives in a namespace of its own (the "switch"). Nothing is added to
# the machine's own namespace: no interface, route or address of the host is
# touched, and the hosts reach only each other. Sourced by the tests:
#
#   . tests/hosts/netns.sh
#   hosts_require              exits 77 (ctest's skip) with a reason where
#                              namespaces cannot be made (not root, no ip/tc)
#   hosts_up N [RATE_MBIT]     makes the hosts; with RATE_MBIT, a tc tbf rate
#                              on both directions of every host's link
#   host_addr I                host I's address
#   host_exec I CMD...         runs CMD on host I (ip netns exec)
#   host_pids I                the pids of the processes left on host I
#   link_down I / link_up I    unplugs / replugs host I's cable at the switch:
#                              packets are dropped silently, as with a cut
#                              cable, rather than refused
#   hosts_down                 kills what runs on the hosts and removes them;
#                              armed on EXIT INT TERM by hosts_up (a script
#                              that sets its own traps afterwards must call it)
#   hosts_clean_stale          removes the namespaces of runs whose process
#                              is gone (a run killed with SIGKILL cannot trap);
#                              hosts_up calls it first
#
# Names are shardplan-hosts-<pid>-<random>-{sw,h0,h1,...}: a run owns the
# names with its pid, so concurrent runs never meet and a stale one is known
# by its dead pid.

HOSTS_PREFIX=shardplan-hosts
HOSTS_RUN=
HOSTS_N=0

hosts_require() {
  local why=
  if [[ $(id -u) -ne 0 ]]; then why="not root"
  elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then why="no ip or tc command"
  else
    local probe="$HOSTS_PREFIX-$$-probe"
    if ! ip netns add "$probe" 2>/dev/null; then why="ip netns add fails here"
    else ip netns del "$probe"; fi
  fi
  if [[ -n $why ]]; then
    echo "SKIP: test hosts need network namespaces (root, ip, tc): $why" >&2
    exit 77
  fi
}

hosts_clean_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$HOSTS_PREFIX-[0-9]*-"); do
    pid=${ns#"$HOSTS_PREFIX"-}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    hosts_remove_ns "$ns"
  done
}

# Processes still inside a namespace keep it (and its addresses) alive after
# `ip netns del`, so they go first.
hosts_remove_ns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  ip netns del "$1" 2>/dev/null
}

hosts_ns() { echo "$HOSTS_RUN-h$1"; }
host_addr() { echo "10.99.0.$(($1 + 1))"; }
host_exec() { local i=$1; shift; ip netns exec "$(hosts_ns "$i")" "$@"; }
host_pids() { ip netns pids "$(hosts_ns "$1")" 2>/dev/null; }
link_down() { ip -n "$HOSTS_RUN-sw" link set "port$1" down; }
link_up() { ip -n "$HOSTS_RUN-sw" link set "port$1" up; }

# A tbf of RATE_MBIT on DEV in namespace NS; the bucket holds 10 ms at the
# rate (at least 16 KiB, more than one 64 KiB TSO segment would need less).
hosts_shape() {
  local ns=$1 dev=$2 mbit=$3 burst
  burst=$((mbit * 1000000 / 8 / 100))
  ((burst < 16384)) && burst=16384
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${mbit}mbit" burst "$burst" latency 100ms
}

hosts_up() {
  local n=$1 rate=${2:-} i ns sw
  [[ $n =~ ^[1-9][0-9]?$ ]] || { echo "hosts_up: host count '$n' must be 1 to 99" >&2; return 2; }
  [[ -z $rate || $rate =~ ^[1-9][0-9]*$ ]] || { echo "hosts_up: rate '$rate' must be a whole number of Mbit/s" >&2; return 2; }
  hosts_clean_stale
  HOSTS_RUN="$HOSTS_PREFIX-$$-$RANDOM"
  HOSTS_N=$n
  trap hosts_down EXIT
  trap 'hosts_down; exit 130' INT
  trap 'hosts_down; exit 143' TERM
  sw="$HOSTS_RUN-sw"
  ip netns add "$sw" || return 1
  ip -n "$sw" link add br0 type bridge || return 1
  ip -n "$sw" link set br0 up || return 1
  for ((i = 0; i < n; i++)); do
    ns=$(hosts_ns "$i")
    ip netns add "$ns" || return 1
    ip link add eth0 netns "$ns" type veth peer name "port$i" netns "$sw" || return 1
    ip -n "$sw" link set "port$i" master br0 up || return 1
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0 || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" link set eth0 up || return 1
    if [[ -n $rate ]]; then
      hosts_shape "$ns" eth0 "$rate" || return 1
      hosts_shape "$sw" "port$i" "$rate" || return 1
    fi
  done
}

hosts_down() {
  [[ -n $HOSTS_RUN ]] || return 0
  local i
  for ((i = 0; i < HOSTS_N; i++)); do hosts_remove_ns "$(hosts_ns "$i")"; done
  hosts_remove_ns "$HOSTS_RUN-sw"
  HOSTS_RUN=
}
