// ParallelReport: bytes per rank, JSON and the printed table.
#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "plan/plan_internal.h"
#include "shardplan/parallelize.h"

namespace shardplan {

using plan_detail::shape_str;

int64_t ParallelReport::local_bytes() const {
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t n = 1;
    if (!r.tied_to.empty()) continue;
    for (auto d : r.local_shape) n *= d;
    total += n * r.element_size;
  }
  return total;
}

int64_t ParallelReport::global_bytes() const {
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t n = 1;
    if (!r.tied_to.empty()) continue;
    for (auto d : r.global_shape) n *= d;
    total += n * r.element_size;
  }
  return total;
}

// JSON string literal: quotes, backslashes and control characters escaped;
// other bytes (UTF-8 in paths) pass through.
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string ParallelReport::json() const {
  std::ostringstream os;
  os << "{\n  \"mesh\": {";
  for (size_t i = 0; i < mesh.axes().size(); ++i)
    os << (i ? ", " : "") << json_str(mesh.axes()[i].first) << ": " << mesh.axes()[i].second;
  os << "},\n  \"rank\": " << rank << ",\n  \"world_size\": " << world_size << ",\n  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ReportRow& r = rows[i];
    os << (i ? "," : "") << "\n    {\"path\": " << json_str(r.path) << ", \"module_type\": " << json_str(r.module_type)
       << ", \"rule\": " << json_str(r.rule) << ", \"layout\": " << json_str(r.layout)
       << ", \"plugin\": " << json_str(r.plugin) << ", \"note\": " << json_str(r.note)
       << ", \"global_shape\": " << shape_str(r.global_shape) << ", \"local_shape\": " << shape_str(r.local_shape)
       << ", \"element_size\": " << r.element_size << ", \"tied_to\": " << json_str(r.tied_to) << "}";
  }
  os << (rows.empty() ? "" : "\n  ") << "],\n  \"warnings\": [";
  for (size_t i = 0; i < warnings.size(); ++i) os << (i ? ", " : "") << json_str(warnings[i]);
  os << "]";
  // Only with `recompute:`: reports of plans without it keep their form.
  if (!recompute.empty()) {
    os << ",\n  \"recompute\": [";
    for (size_t i = 0; i < recompute.size(); ++i)
      os << (i ? ", " : "") << "{\"path\": " << json_str(recompute[i].path)
         << ", \"module_type\": " << json_str(recompute[i].module_type) << ", \"mode\": " << json_str(recompute[i].mode)
         << ", \"rule\": " << json_str(recompute[i].rule) << "}";
    os << "]";
  }
  os << ",\n  \"local_bytes\": " << local_bytes() << ",\n  \"global_bytes\": " << global_bytes() << "\n}";
  return os.str();
}

// Each column as wide as its widest cell and two spaces, never narrower
// than before (the printed reports people compare keep their shape): a
// conv weight's "[model, null, null, null]" ran into its shape.
std::string ParallelReport::table() const {
  std::ostringstream os;
  os << "mesh " << mesh.str() << ", rank " << rank << " of " << world_size << "\n";
  size_t w = 9, lw = 14, gw = 12, locw = 12, pw = 6;
  for (const auto& r : rows) {
    w = std::max(w, r.path.size());
    lw = std::max(lw, r.layout.size());
    gw = std::max(gw, shape_str(r.global_shape).size());
    locw = std::max(locw, shape_str(r.local_shape).size());
    pw = std::max(pw, r.plugin.size());
  }
  auto col = [&os](size_t width) -> std::ostream& { return os << std::setw(static_cast<int>(width) + 2); };
  os << std::left;
  col(w) << "parameter";
  col(lw) << "layout";
  col(gw) << "global";
  col(locw) << "local";
  col(pw) << "plugin";
  os << "rule / note\n";
  for (const auto& r : rows) {
    col(w) << r.path;
    col(lw) << r.layout;
    col(gw) << shape_str(r.global_shape);
    col(locw) << shape_str(r.local_shape);
    col(pw) << (r.plugin.empty() ? "-" : r.plugin);
    os << r.rule << (r.rule.empty() || r.note.empty() ? "" : " ") << r.note << "\n";
  }
  for (const auto& rc : recompute)
    os << "recompute " << rc.mode << ": " << rc.path << " (" << rc.module_type << "), " << rc.rule << "\n";
  for (const auto& wmsg : warnings) os << "warning: " << wmsg << "\n";
  os << "parameter bytes on this rank: " << local_bytes() << " of " << global_bytes() << "\n";
  return os.str();
}

}  // namespace shardplan
