#include "report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "shardplan/comm_dtype.h"

#ifndef SHARDPLAN_VERSION_STRING
#define SHARDPLAN_VERSION_STRING "unknown"
#endif

namespace shardplan_bench {

namespace {

std::string first_line_with(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size(), key) == 0) {
      std::string v = line.substr(line.find_first_of(":=", key.size()) + 1);
      v.erase(0, v.find_first_not_of(" \t\""));
      while (!v.empty() && (v.back() == '"' || v.back() == ' ')) v.pop_back();
      return v;
    }
  return {};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

const char* redop(Collective c) { return reduces(c) ? "sum" : "none"; }
int root(Collective c) { return has_root(c) ? 0 : -1; }

// The six figures of one mode as strings; `missing` where not measured.
std::vector<std::string> mode_fields(const Row& r, const ModeResult& m, int ranks, const char* num_fmt,
                                     const char* bw_fmt, const std::string& missing, const std::string& unchecked) {
  if (!m.measured) return std::vector<std::string>(6, missing);
  return {fmt(num_fmt, m.mean_s * 1e6),
          fmt(bw_fmt, algbw_gbps(r.bytes, m)),
          fmt(bw_fmt, busbw_gbps(r.coll, ranks, r.bytes, m)),
          m.wrong < 0 ? unchecked : std::to_string(m.wrong),
          fmt(num_fmt, m.p50_s * 1e6),
          fmt(num_fmt, m.p99_s * 1e6)};
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c < 0x20) o += fmt("\\u%04x", c);
    else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string factor_text(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "2(n-1)/n";
    case Collective::Broadcast:
    case Collective::SendRecv: return "1";
    default: return "(n-1)/n";
  }
}

// Every row of every series as (series, row) in output order.
template <class F>
void for_rows(const std::vector<SeriesResult>& results, F f) {
  for (const SeriesResult& s : results)
    for (const Row& r : s.rows) f(s, r);
}

}  // namespace

const std::vector<std::string>& row_columns() {
  static const std::vector<std::string> cols{
      "backend",        "reference",      "ranks",     "collective", "size_bytes",  "count",
      "type",           "redop",          "root",      "oop_time_us", "oop_algbw_GBps", "oop_busbw_GBps",
      "oop_wrong",      "oop_p50_us",     "oop_p99_us", "ip_time_us",  "ip_algbw_GBps",  "ip_busbw_GBps",
      "ip_wrong",       "ip_p50_us",      "ip_p99_us"};
  return cols;
}

double algbw_gbps(uint64_t bytes, const ModeResult& m) { return static_cast<double>(bytes) / m.mean_s / 1e9; }
double busbw_gbps(Collective c, int ranks, uint64_t bytes, const ModeResult& m) {
  return algbw_gbps(bytes, m) * busbw_factor(c, ranks);
}

RunInfo describe_run(double seconds) {
  RunInfo info;
  info.seconds = seconds;
  info.version = SHARDPLAN_VERSION_STRING;
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  info.date = buf;
  utsname u{};
  ::uname(&u);
  std::string os = first_line_with("/etc/os-release", "PRETTY_NAME");
  std::string cpu = first_line_with("/proc/cpuinfo", "model name");
  info.host = std::string(u.nodename) + ": " + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " CPUs" +
              (cpu.empty() ? "" : " (" + cpu + ")") + ", " + fmt("%.0f GiB", ::sysconf(_SC_PHYS_PAGES) *
                                                                             double(::sysconf(_SC_PAGESIZE)) /
                                                                             (1024.0 * 1024 * 1024)) +
              ", " + (os.empty() ? std::string(u.sysname) : os) + ", Linux " + u.release;
  return info;
}

void print_tables(FILE* out, const Options& o, const RunInfo& info, const std::vector<SeriesResult>& results,
                  const std::vector<Unavailable>& unavailable) {
  const char* type = shardplan::comm::dtype_name(o.sweep.dtype);
  const auto sizes = o.sweep.sizes();
  std::fprintf(out, "# shardplan bench comm  (shardplan %s, %s)\n", info.version.c_str(), info.date.c_str());
  std::fprintf(out, "# host: %s\n", info.host.c_str());
  std::fprintf(out, "# %d ranks, %s, sizes %s .. %s (x%g, %zu steps), %d timed calls per size and mode, %d warm-up, check %s\n",
               o.ranks, type, human_bytes(o.sweep.min_bytes).c_str(), human_bytes(o.sweep.max_bytes).c_str(),
               o.sweep.factor, sizes.size(), o.sweep.iters, o.sweep.warmup, o.sweep.check ? "on" : "off");
  std::fprintf(out,
               "# size: total bytes as in nccl-tests, the larger of one rank's send and receive buffers (all_gather:\n"
               "#   the gathered buffer; reduce_scatter: the buffer scattered; send_recv: the bytes each rank sends);\n"
               "#   count: elements per NCCL-style call (per rank block for all_gather, reduce_scatter, all_to_all).\n"
               "# time: mean us per call, averaged over ranks; p50/p99: single calls, slowest rank; algbw = size/time;\n"
               "#   busbw = algbw * factor; GB = 1e9 bytes. #wrong: elements differing from the expected result,\n"
               "#   summed over ranks (N/A without --check). '-': not measured (unsupported; see the notes).\n");
  std::fprintf(out, "# series:\n");
  for (const SeriesResult& s : results)
    std::fprintf(out, "#   %-10s %-9s %s%s\n", s.series.name.c_str(), s.series.reference() ? "reference" : "plugin",
                 s.series.describe(o.ranks).c_str(), s.ok ? "" : ("  FAILED: " + s.error).c_str());
  for (const Unavailable& u : unavailable)
    std::fprintf(out, "#   %-10s %-9s not run: %s\n", u.name.c_str(), "", u.reason.c_str());
  for (const SeriesResult& s : results)
    for (const std::string& n : s.notes) std::fprintf(out, "# note: %s: %s\n", s.series.name.c_str(), n.c_str());

  const char* num = "%.2f";
  const char* bw = "%.3f";
  for (Collective c : o.sweep.collectives) {
    bool any = false;
    for_rows(results, [&](const SeriesResult&, const Row& r) { any |= r.coll == c; });
    if (!any) continue;
    std::fprintf(out, "\n# %s, busbw factor %s = %.3f\n", collective_name(c), factor_text(c).c_str(),
                 busbw_factor(c, o.ranks));
    std::fprintf(out, "#%-9s %12s %12s %8s %6s %5s  %-57s  %s\n", "", "", "", "", "", "",
                 "---------------------- out-of-place --------------------",
                 "----------------------- in-place -----------------------");
    const char* hdr = "%10s %8s %8s %7s %10s %10s";
    std::fprintf(out, "#%-9s %12s %12s %8s %6s %5s  ", "backend", "size", "count", "type", "redop", "root");
    std::fprintf(out, hdr, "time", "algbw", "busbw", "#wrong", "p50", "p99");
    std::fprintf(out, "  ");
    std::fprintf(out, hdr, "time", "algbw", "busbw", "#wrong", "p50", "p99");
    std::fprintf(out, "\n#%-9s %12s %12s %8s %6s %5s  ", "", "(B)", "(elements)", "", "", "");
    std::fprintf(out, hdr, "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
    std::fprintf(out, "  ");
    std::fprintf(out, hdr, "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
    std::fprintf(out, "\n");
    for (const SeriesResult& s : results) {
      bool printed = false;
      for (const Row& r : s.rows) {
        if (r.coll != c) continue;
        printed = true;
        std::fprintf(out, " %-9s %12llu %12llu %8s %6s %5d  ", s.series.name.c_str(),
                     static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.count), type,
                     redop(c), root(c));
        auto a = mode_fields(r, r.out, o.ranks, num, bw, "-", "N/A");
        auto b = mode_fields(r, r.in, o.ranks, num, bw, "-", "N/A");
        std::fprintf(out, hdr, a[0].c_str(), a[1].c_str(), a[2].c_str(), a[3].c_str(), a[4].c_str(), a[5].c_str());
        std::fprintf(out, "  ");
        std::fprintf(out, hdr, b[0].c_str(), b[1].c_str(), b[2].c_str(), b[3].c_str(), b[4].c_str(), b[5].c_str());
        std::fprintf(out, "\n");
      }
      if (printed) std::fprintf(out, "\n");
    }
  }

  // Summary: one line per series, one column per collective.
  auto summary = [&](const char* title, bool largest, auto value) {
    std::fprintf(out, "# summary: %s\n#%-9s", title, "backend");
    for (Collective c : o.sweep.collectives) std::fprintf(out, " %14s", collective_name(c));
    std::fprintf(out, "\n");
    for (const SeriesResult& s : results) {
      if (s.rows.empty()) continue;
      std::fprintf(out, " %-9s", s.series.name.c_str());
      for (Collective c : o.sweep.collectives) {
        const Row* pick = nullptr;
        for (const Row& r : s.rows)
          if (r.coll == c && (!pick || (largest ? r.bytes > pick->bytes : r.bytes < pick->bytes))) pick = &r;
        std::string v = "-";
        if (pick && pick->out.measured) v = fmt(largest ? "%.3f" : "%.2f", value(*pick));
        std::fprintf(out, " %14s", v.c_str());
      }
      std::fprintf(out, "\n");
    }
  };
  summary("out-of-place busbw (GB/s) at the largest size", true,
          [&](const Row& r) { return busbw_gbps(r.coll, o.ranks, r.bytes, r.out); });
  std::fprintf(out, "\n");
  summary("out-of-place p50 latency (us) at the smallest size", false, [](const Row& r) { return r.out.p50_s * 1e6; });

  int64_t wrong = 0;
  bool unchecked = true;
  for_rows(results, [&](const SeriesResult&, const Row& r) {
    for (const ModeResult* m : {&r.out, &r.in})
      if (m->measured && m->wrong >= 0) {
        wrong += m->wrong;
        unchecked = false;
      }
  });
  std::fprintf(out, "\n# wrong elements: %s\n",
               unchecked ? "N/A (no --check)" : (std::to_string(wrong) + (wrong ? " FAILED" : " OK")).c_str());
  std::fprintf(out, "# total time: %.1f s\n", info.seconds);
}

void write_csv(const std::string& path, const Options& o, const std::vector<SeriesResult>& results) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  const auto& cols = row_columns();
  for (size_t i = 0; i < cols.size(); ++i) f << (i ? "," : "") << cols[i];
  f << "\n";
  const char* type = shardplan::comm::dtype_name(o.sweep.dtype);
  for_rows(results, [&](const SeriesResult& s, const Row& r) {
    f << s.series.name << "," << (s.series.reference() ? 1 : 0) << "," << o.ranks << "," << collective_name(r.coll)
      << "," << r.bytes << "," << r.count << "," << type << "," << redop(r.coll) << "," << root(r.coll);
    for (const ModeResult* m : {&r.out, &r.in})
      for (const std::string& v : mode_fields(r, *m, o.ranks, "%.4f", "%.6f", "", "")) f << "," << v;
    f << "\n";
  });
  if (!f) throw std::runtime_error("cannot write " + path);
}

void write_json(const std::string& path, const Options& o, const RunInfo& info,
                const std::vector<SeriesResult>& results, const std::vector<Unavailable>& unavailable) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  const char* type = shardplan::comm::dtype_name(o.sweep.dtype);
  f << "{\n  \"tool\": \"shardplan bench comm\",\n  \"version\": " << json_string(info.version)
    << ",\n  \"date\": " << json_string(info.date) << ",\n  \"host\": " << json_string(info.host)
    << ",\n  \"ranks\": " << o.ranks << ",\n  \"type\": " << json_string(type) << ",\n  \"iters\": " << o.sweep.iters
    << ",\n  \"warmup\": " << o.sweep.warmup << ",\n  \"check\": " << (o.sweep.check ? "true" : "false")
    << ",\n  \"seconds\": " << fmt("%.3f", info.seconds) << ",\n  \"sizes_requested\": [";
  const auto sizes = o.sweep.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) f << (i ? ", " : "") << sizes[i];
  f << "],\n  \"series\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const SeriesResult& s = results[i];
    f << (i ? "," : "") << "\n    {\"backend\": " << json_string(s.series.name)
      << ", \"reference\": " << (s.series.reference() ? "true" : "false")
      << ", \"launch\": " << json_string(s.series.launch) << ", \"how\": " << json_string(s.series.describe(o.ranks))
      << ", \"status\": " << json_string(s.ok ? "ok" : "failed")
      << ", \"error\": " << (s.ok ? "null" : json_string(s.error)) << ", \"seconds\": " << fmt("%.3f", s.seconds)
      << ", \"notes\": [";
    for (size_t k = 0; k < s.notes.size(); ++k) f << (k ? ", " : "") << json_string(s.notes[k]);
    f << "]}";
  }
  f << "\n  ],\n  \"unavailable\": [";
  for (size_t i = 0; i < unavailable.size(); ++i)
    f << (i ? "," : "") << "\n    {\"backend\": " << json_string(unavailable[i].name)
      << ", \"reason\": " << json_string(unavailable[i].reason) << "}";
  f << "\n  ],\n  \"rows\": [";
  bool first = true;
  for_rows(results, [&](const SeriesResult& s, const Row& r) {
    std::vector<std::string> v{json_string(s.series.name), s.series.reference() ? "true" : "false",
                               std::to_string(o.ranks), json_string(collective_name(r.coll)),
                               std::to_string(r.bytes), std::to_string(r.count), json_string(type),
                               json_string(redop(r.coll)), std::to_string(root(r.coll))};
    for (const ModeResult* m : {&r.out, &r.in})
      for (const std::string& x : mode_fields(r, *m, o.ranks, "%.4f", "%.6f", "null", "null")) v.push_back(x);
    const auto& cols = row_columns();
    f << (first ? "" : ",") << "\n    {";
    for (size_t i = 0; i < cols.size(); ++i) f << (i ? ", " : "") << json_string(cols[i]) << ": " << v[i];
    f << "}";
    first = false;
  });
  f << "\n  ]\n}\n";
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace shardplan_bench
