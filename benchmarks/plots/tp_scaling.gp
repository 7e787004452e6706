# TP scaling, drawn from figures already in docs/BENCHMARKS.md (no new
# measurement; the numbers below are copied from its tables):
#   left:  activation memory kept per rank at 1, 2 and 4 ranks, plans/gpt.yaml
#          and plans/gpt_sp.yaml (section "sequence parallelism: activation
#          memory per rank (bench_sp_memory)", 2026-11-25, exact byte counts);
#   right: CPU time per forward+backward step of one layer, rank 0, unsharded
#          torch::nn on 1 thread, sharded at world size 1 and at world size 2
#          on the local backend (section "layers: forward+backward of each
#          layer, sharded vs torch::nn (bench_layers)", its CPU table,
#          2026-11-21, load average 9.5-13.7; the embedding and cross_entropy
#          rows at world size 1 predate that day's fix, after which both
#          plugins install no strategy over an axis of one rank).
# Both on the 2-core AMD EPYC VM (Debian 12, libtorch 1.13.1 CPU).
#
# From the repository root (needs gnuplot, Debian gnuplot-nox):
#   gnuplot benchmarks/plots/tp_scaling.gp      # writes docs/tp_scaling.png

# ranks, saved bytes per rank with plans/gpt.yaml, with plans/gpt_sp.yaml
# (gpt_sp.yaml's column "vs plans/gpt.yaml": 1.00, 0.92, 0.81; drawn as a label)
$memory << EOD
1 107055112 107055112
2  64094216  58810376
4  42598408  34672648
EOD

# layer, CPU µs: torch::nn 1 thread, local world size 1, local world size 2 (rank 0)
$layers << EOD
linear_column       8586  8817  5026
linear_row          8419  8605  4849
embedding_vocab     2622  3566  3920
conv2d_out_channel  1444  1443  1173
lstm_hidden        14108 14693  9931
mha_heads          11667 11596  7809
cross_entropy_vocab 3654  9230  4155
EOD

set terminal pngcairo size 1200,540 font 'sans,9' noenhanced
set output 'docs/tp_scaling.png'
set multiplot layout 1,2 title "Tensor parallelism on a 2-core AMD EPYC VM (Debian 12, libtorch 1.13.1 CPU): what one rank keeps and computes\nfigures of docs/BENCHMARKS.md (sections \"sequence parallelism\" and \"layers\")" font 'sans,11'

set title "Activation memory kept per rank for backward, example GPT\n(bench_sp_memory, local backend, float32, 2026-11-25)"
set logscale x 2
set xrange [0.8:5]
set xtics ("1" 1, "2" 2, "4" 4)
set xlabel 'ranks (tensor-parallel axis)'
set ylabel 'MB per rank (1 MB = 1,000,000 bytes)'
set yrange [0:120]
set grid ytics
set key top right
set label 1 "per rank, gpt_sp.yaml ÷ gpt.yaml:\n0.92 at 2 ranks, 0.81 at 4" at graph 0.97,0.72 right tc rgb '#d62728'
plot 107055112/x/1e6 with lines dt 2 lc rgb 'gray40' title 'ideal: 1-rank figure / ranks', \
     $memory using 1:($2/1e6) with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'plans/gpt.yaml', \
     $memory using 1:($3/1e6) with linespoints lw 2 pt 5 lc rgb '#d62728' title 'plans/gpt_sp.yaml (sequence parallel)'

unset logscale x
unset label 1
unset xrange
unset xlabel
set autoscale y
set yrange [0:19000]
set title "CPU per forward+backward step of one layer, rank 0's thread\n(bench_layers, local backend, 1 thread per rank, 2026-11-21, load 9.5-13.7;\nembedding and cross_entropy at world size 1 measured before that day's fix)"
set ylabel 'CPU µs per step'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -25 nomirror
set key top center horizontal
plot $layers using 2:xtic(1) lc rgb 'gray60' title 'torch::nn, 1 thread', \
     '' using 3 lc rgb '#1f77b4' title 'sharded, world size 1', \
     '' using 4 lc rgb '#2ca02c' title 'sharded, world size 2 (per rank)'
unset multiplot
