#!/usr/bin/env bash
# two_nodes_gloo.sh <shardplan> <launcher_probe> <nproc_per_node> -- prog args...
# One gloo job over two launchers acting as two nodes, on a free port.
set -euo pipefail
shardplan=$1 probe=$2 nproc=$3
shift 3
[ "$1" = "--" ] && shift
port=$("$probe" --free-port)
exec bash "$(dirname "$0")/../launcher/two_nodes.sh" "$shardplan" "$nproc" "$port" --backend gloo -- "$@"
