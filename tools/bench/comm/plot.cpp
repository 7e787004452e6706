#include "plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

#include "report.h"
#include "series.h"
#include "shardplan/comm_dtype.h"

namespace shardplan_bench {

std::string gnuplot_missing_message() {
  return "--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox; "
         "or run scripts/setup-deps.sh)";
}

namespace {

std::string label(uint64_t b) {
  std::string s = human_bytes(b);
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

}  // namespace

void plot_png(const std::string& png, const Options& o, const std::vector<SeriesResult>& results) {
  const std::string gnuplot = find_program("gnuplot");
  if (gnuplot.empty()) throw std::runtime_error(gnuplot_missing_message());

  std::vector<Collective> colls;
  for (Collective c : o.sweep.collectives)
    for (const SeriesResult& s : results)
      for (const Row& r : s.rows)
        if (r.coll == c && r.out.measured && std::find(colls.begin(), colls.end(), c) == colls.end())
          colls.push_back(c);
  if (colls.empty()) throw std::runtime_error("--plot: nothing was measured");

  char tmpl[] = "/tmp/shardplan-bench-plot.XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("--plot: cannot create a temporary file");
  ::close(fd);
  const std::string script = tmpl;
  std::ofstream gp(script);

  // One colour per backend, the same in every panel; a reference is drawn
  // dashed in the colour of the backend it bounds (roofline: local).
  static const char* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                        "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  auto base_of = [](const std::string& name) {
    if (name == "roofline") return std::string("local");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "-raw") == 0) return name.substr(0, name.size() - 4);
    return name;
  };
  std::map<std::string, std::string> colour;
  std::map<std::string, std::string> by_base;
  for (const SeriesResult& s : results) {
    const std::string base = base_of(s.series.name);
    if (!by_base.count(base)) by_base[base] = palette[by_base.size() % 8];
    colour[s.series.name] = by_base[base];
  }
  std::map<std::string, int> index;
  for (const SeriesResult& s : results) index.emplace(s.series.name, static_cast<int>(index.size()) + 1);

  const int rows = static_cast<int>(colls.size());
  // libgd's png terminal rather than pngcairo: a third of the bytes (no
  // anti-aliasing) for a chart of lines, and it is in every gnuplot build.
  gp << "set terminal png noenhanced size 1200," << 50 + 280 * rows << " font 'sans,9'\n"
     << "set output '" << png << "'\n"
     << "set multiplot layout " << rows << ",2 title 'shardplan bench comm: " << o.ranks << " ranks, "
     << shardplan::comm::dtype_name(o.sweep.dtype) << ", out-of-place' font 'sans,13'\n"
     << "set logscale xy\nset grid xtics ytics mxtics mytics lc rgb '#dddddd'\n"
     << "set key top left samplen 3\nset xlabel 'size (bytes, nccl-tests convention)'\n"
     << "set format y '%g'\n";
  gp << "set xtics (";
  bool first = true;
  for (uint64_t b = 1; b <= (uint64_t(1) << 40); b *= 16)
    if (b * 4 >= o.sweep.min_bytes && b <= o.sweep.max_bytes * 4) {
      gp << (first ? "" : ", ") << "'" << label(b) << "' " << b;
      first = false;
    }
  gp << ")\n";

  for (size_t ci = 0; ci < colls.size(); ++ci) {
    const Collective c = colls[ci];
    for (int panel = 0; panel < 2; ++panel) {
      // Data blocks first: gnuplot wants them defined before the plot line.
      std::vector<std::string> parts;
      for (const SeriesResult& s : results) {
        // Log axes: busbw is 0 for one rank, and zeros cannot be drawn.
        std::vector<std::pair<uint64_t, double>> points;
        for (const Row& r : s.rows) {
          if (r.coll != c || !r.out.measured) continue;
          const double y = panel == 0 ? busbw_gbps(c, o.ranks, r.bytes, r.out) : r.out.p50_s * 1e6;
          if (y > 0) points.emplace_back(r.bytes, y);
        }
        if (points.empty()) continue;
        const std::string block = "$d" + std::to_string(ci) + "_" + std::to_string(panel) + "_" +
                                  std::to_string(index[s.series.name]);
        gp << block << " << EOD\n";
        for (const auto& p : points) gp << p.first << " " << p.second << "\n";
        gp << "EOD\n";
        // libgd draws no dashes: references are thin with open points.
        parts.push_back(block + " using 1:2 with linespoints lc rgb '" + colour[s.series.name] + "' " +
                        (s.series.reference() ? "lw 1 dt 2 pt 6" : "lw 2 pt 7") + " ps 0.6 title '" + s.series.name +
                        "'");
      }
      gp << "set title '" << collective_name(c) << (panel == 0 ? ": bus bandwidth" : ": latency (p50)") << "'\n"
         << "set ylabel '" << (panel == 0 ? "busbw (GB/s)" : "time per call (us)") << "'\n";
      if (parts.empty()) {
        gp << "set multiplot next\n";
        continue;
      }
      gp << "plot ";
      for (size_t k = 0; k < parts.size(); ++k) gp << (k ? ", \\\n     " : "") << parts[k];
      gp << "\n";
    }
  }
  gp << "unset multiplot\n";
  gp.close();

  const std::string cmd = "'" + gnuplot + "' '" + script + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    throw std::runtime_error("--plot: gnuplot failed (status " + std::to_string(rc) + "); its script is " + script);
  }
  std::remove(script.c_str());
}

}  // namespace shardplan_bench
