#!/usr/bin/env bash
# two_hosts.sh <shardplan> <nproc_per_node> [launch options...] -- prog args...
# One job on two test hosts (tests/hosts/netns.sh): node K's launcher runs on
# host K with --local-addr set to that host's address and --master-addr to
# host 0's, so everything between the nodes crosses the hosts' link (the
# ranks of one host share memory). tests/launcher/two_nodes.sh supervises the
# two launchers. Exits 77 where namespaces cannot be made; otherwise 1 when the
# job fails, when fewer than $TWO_HOSTS_MIN_BYTES (default 100000) bytes
# crossed host 1's link, or when a process is left on a host after its
# launcher exited. $TWO_HOSTS_RATE_MBIT shapes the link.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns.sh"
hosts_require
[[ $# -ge 4 ]] || { echo "usage: two_hosts.sh <shardplan> <nproc_per_node> [launch options...] -- prog args..." >&2; exit 2; }
shardplan=$1 nproc=$2
shift 2
hosts_up 2 "${TWO_HOSTS_RATE_MBIT:-}" || { echo "two_hosts.sh: cannot make the test hosts" >&2; exit 1; }

export TWO_NODES_ADDRS="$(host_addr 0) $(host_addr 1)"
export TWO_NODES_EXEC_0="ip netns exec $(hosts_ns 0)" TWO_NODES_EXEC_1="ip netns exec $(hosts_ns 1)"
bash "$HERE/../launcher/two_nodes.sh" "$shardplan" "$nproc" 29500 "$@"
rc=$?

bytes=$(host_exec 1 cat /sys/class/net/eth0/statistics/tx_bytes)
echo "two_hosts.sh: $bytes bytes left host 1 over its link"
if ((rc == 0 && bytes < ${TWO_HOSTS_MIN_BYTES:-100000})); then
  echo "two_hosts.sh: only $bytes bytes crossed the link: the nodes did not talk over it" >&2
  rc=1
fi
for i in 0 1; do
  left=$(host_pids "$i")
  if [[ -n $left ]]; then
    echo "two_hosts.sh: processes left on host $i after its launcher exited: $(ps -o pid=,args= -p ${left//$'\n'/,})" >&2
    rc=1
  fi
done
exit "$rc"
