#!/usr/bin/env bash
# Plots bench_async_tp's outputs (docs/BENCHMARKS.md, "async tensor
# parallelism"): per run one panel, per size the fraction of the sync path's
# communication each ring mode hid, (t_sync - t_mode) / t_comm, clipped to
# [-300%, 300%]; the issue's 50% target as a line.
#
#   benchmarks/async_tp/plot.sh OUT.png "TITLE=FILE" ["TITLE=FILE" ...]
#
# FILE: what bench_async_tp printed (a launcher's "[rank 0] " prefix is fine);
# where it has the paired columns, those are drawn (less drift between rounds).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 OUT.png \"TITLE=FILE\" [\"TITLE=FILE\" ...]" >&2
  exit 2
fi
command -v gnuplot >/dev/null || { echo "$0: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 2; }
out=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for run in "$@"; do
  title=${run%%=*}
  file=${run#*=}
  [[ -r "$file" ]] || { echo "$0: cannot read '$file'" >&2; exit 2; }
  # tokens embed sync ring bidir split comm hid_ring hid_bidir hid_split [pair_ring pair_bidir pair_split]
  sed 's/^\[rank [0-9]*\] //; s/%//g' "$file" |
    awk '$1 ~ /^[0-9]+$/ && NF == 10 { printf "%sx%s %s %s %s\n", $1, $2, $8, $9, $10 }
         $1 ~ /^[0-9]+$/ && NF == 13 { printf "%sx%s %s %s %s\n", $1, $2, $11, $12, $13 }' >"$tmp/$n.dat"
  [[ -s "$tmp/$n.dat" ]] || { echo "$0: no result lines in '$file'" >&2; exit 2; }
  printf '%s\n' "$title" >"$tmp/$n.title"
  n=$((n + 1))
done
cols=$(( n < 2 ? 1 : 2 ))
rows=$(( (n + cols - 1) / cols ))
{
  echo "set terminal pngcairo size $((cols * 560)),$((rows * 330)) font 'sans,9'"
  echo "set output '$out'"
  echo "set multiplot layout $rows,$cols"
  echo "set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1"
  echo "set yrange [-300:300]; set ylabel 'communication hidden (%)'; set xtics rotate by -30"
  echo "set grid ytics; set key below horizontal"
  for ((i = 0; i < n; i++)); do
    echo "set title \"$(cat "$tmp/$i.title")\""
    echo "plot '$tmp/$i.dat' using (\$2>300?300:\$2<-300?-300:\$2):xtic(1) title 'ring', '' using (\$3>300?300:\$3<-300?-300:\$3) title 'bidirectional', '' using (\$4>300?300:\$4<-300?-300:\$4) title 'split', 50 with lines dt 2 lc rgb 'black' title '50% target'"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "wrote $out"
