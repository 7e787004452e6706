#include "shardplan/plan.h"

#include "plan_data_parallel.h"
#include "plan_divide.h"
#include "plan_pipeline.h"
#include "plan_recompute.h"
#include "plan_sequence_parallel.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <set>
#include <sstream>

#include "plan_internal.h"

namespace shardplan {

namespace plan_detail {

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

SourceLoc loc_of(const YAML::Node& n, const SourceLoc& fallback) {
  if (n.IsNull() || n.Mark().is_null()) return fallback;
  return SourceLoc{fallback.file, n.Mark().line + 1, n.Mark().column + 1};
}

std::optional<int> parse_positive_int(const std::string& s) {
  int value = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, value);
  if (ec != std::errc() || ptr != end || s.empty() || value < 1) return std::nullopt;
  return value;
}

std::string mesh_spec_str(const std::vector<MeshAxisSpec>& mesh) {
  std::vector<std::string> parts;
  for (const auto& axis : mesh)
    parts.push_back(axis.name + ": " +
                    (axis.size == MeshAxisSpec::kAutoSize ? "auto" : std::to_string(axis.size)));
  return "{" + join(parts, ", ") + "}";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(std::to_string(d));
  return "[" + join(dims, ", ") + "]";
}

// --- Canonical YAML scalars -------------------------------------------------

bool is_plain_safe(const std::string& s) {
  if (s.empty()) return false;
  static const std::set<std::string> kReserved = {"null", "true", "false", "yes", "no",
                                                  "on",   "off",  "y",     "n",   "~"};
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (kReserved.count(lower)) return false;
  const char first = s[0];
  if (!(std::isalnum(static_cast<unsigned char>(first)) || first == '_' || first == '/' || first == '.'))
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '/'))
      return false;
  return true;
}

std::string quoted(const std::string& s) {
  bool has_control = false;
  for (unsigned char c : s) has_control |= (c < 0x20 || c == 0x7f);
  if (!has_control) {
    std::string out = "'";
    for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string scalar(const std::string& s) { return is_plain_safe(s) ? s : quoted(s); }

}  // namespace plan_detail

using plan_detail::join;
using plan_detail::mesh_spec_str;
using plan_detail::scalar;
using plan_detail::quoted;
using plan_detail::shape_str;

std::string layout_str(const Layout& layout) {
  std::vector<std::string> parts;
  for (const auto& dim : layout) parts.push_back(dim ? *dim : "null");
  return "[" + join(parts, ", ") + "]";
}

const RuleOption* Rule::option(const std::string& key) const {
  auto it = options.find(key);
  return it == options.end() ? nullptr : &it->second;
}

std::string Rule::option_or(const std::string& key, const std::string& fallback,
                            const std::vector<std::string>& allowed) const {
  const RuleOption* opt = option(key);
  if (!opt) return fallback;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), opt->value) == allowed.end())
    throw PlanError(opt->loc, key + " must be one of " + join(allowed, ", ") + ", got '" + opt->value + "'");
  return opt->value;
}

const Rule* Plan::match(const std::string& path) const {
  for (const Rule& rule : rules)
    if (rule.matches(path)) return &rule;
  return nullptr;
}

Mesh Plan::resolve_mesh(int world_size) const {
  if (world_size < 1) throw Error("world size must be >= 1, got " + std::to_string(world_size));
  int64_t fixed = 1;
  const MeshAxisSpec* auto_axis = nullptr;
  for (const auto& axis : mesh) {
    if (axis.size == MeshAxisSpec::kAutoSize)
      auto_axis = &axis;
    else
      fixed *= axis.size;
  }
  const std::string spec = mesh_spec_str(mesh);
  const std::string world =
      "the world has " + std::to_string(world_size) + " rank" + (world_size == 1 ? "" : "s");
  if (auto_axis && world_size % fixed != 0)
    throw PlanError(mesh_loc, "mesh " + spec + " needs a world size divisible by " + std::to_string(fixed) +
                                  " but " + world);
  if (!auto_axis && fixed != world_size)
    throw PlanError(mesh_loc, "mesh " + spec + " has " + std::to_string(fixed) + " ranks but " + world);
  std::vector<std::pair<std::string, int>> axes;
  for (const auto& axis : mesh)
    axes.emplace_back(
        axis.name, axis.size == MeshAxisSpec::kAutoSize ? static_cast<int>(world_size / fixed) : axis.size);
  return Mesh(std::move(axes));
}

PlanMatch Plan::assign(const std::vector<ParamInfo>& params, int world_size,
                       const std::vector<std::string>& module_paths, std::vector<std::string>* errors) const {
  PlanMatch out;
  out.mesh = resolve_mesh(world_size);
  std::vector<size_t> hits(rules.size(), 0);
  out.params.reserve(params.size());
  for (const ParamInfo& p : params) {
    Assignment a;
    a.path = p.path;
    a.shape = p.shape;
    a.rule = match(p.path);
    if (a.rule) {
      const Rule& r = *a.rule;
      if (r.layout.size() != p.shape.size()) {
        auto dims = [](size_t n) { return std::to_string(n) + (n == 1 ? " dim" : " dims"); };
        const PlanError err(r.layout_loc, "layout " + layout_str(r.layout) + " has " + dims(r.layout.size()) +
                                              " but parameter '" + p.path + "' has " + dims(p.shape.size()) +
                                              " (shape " + shape_str(p.shape) + ")");
        if (!errors) throw err;
        errors->push_back(err.what());
        ++hits[static_cast<size_t>(a.rule - rules.data())];
        a.rule = nullptr;
      }
    }
    if (a.rule) {
      a.layout = a.rule->layout;
      ++hits[static_cast<size_t>(a.rule - rules.data())];
    } else {
      a.layout = Layout(p.shape.size());
    }
    out.params.push_back(std::move(a));
  }
  out.modules.reserve(module_paths.size());
  for (const std::string& path : module_paths) {
    Assignment a;
    a.path = path;
    a.rule = match(path);
    if (a.rule) {
      a.layout = a.rule->layout;
      ++hits[static_cast<size_t>(a.rule - rules.data())];
    }
    out.modules.push_back(std::move(a));
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    if (hits[i]) continue;
    const PlanError err(rules[i].loc, "rule " + std::to_string(i + 1) + " (match: '" + rules[i].pattern +
                                          "') matched no parameter");
    if (strict && !errors) throw err;
    (strict ? *errors : out.warnings).push_back(err.what());
  }
  return out;
}

namespace {

void write_comment(std::ostringstream& y, const std::string& text, const char* indent) {
  if (text.empty()) return;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    y << indent << (line.empty() ? "#" : "# " + line) << "\n";
    begin = end + 1;
  }
}

}  // namespace

std::string Plan::to_yaml() const {
  std::ostringstream y;
  write_comment(y, comment, "");
  y << "version: " << version << "\n";
  std::vector<std::string> axes;
  for (const auto& axis : mesh)
    axes.push_back(scalar(axis.name) + ": " +
                   (axis.size == MeshAxisSpec::kAutoSize ? "auto" : std::to_string(axis.size)));
  y << "mesh: {" << join(axes, ", ") << "}\n";
  if (!plugin_dirs.empty()) {
    std::vector<std::string> dirs;
    for (const auto& d : plugin_dirs) dirs.push_back(scalar(d));
    y << "plugins: [" << join(dirs, ", ") << "]\n";
  }
  y << "strict: " << (strict ? "true" : "false") << "\n";
  if (paths != "torch") y << "paths: " << paths << "\n";
  y << detail::data_parallel_yaml(*this);
  y << detail::sequence_parallel_yaml(*this);
  y << detail::divide_yaml(*this);
  y << detail::recompute_yaml(*this);
  y << detail::pipeline_yaml(*this);
  if (rules.empty()) {
    y << "rules: []\n";
    return y.str();
  }
  y << "rules:\n";
  for (const Rule& rule : rules) {
    write_comment(y, rule.comment, "  ");
    // Patterns always quoted: regexes are full of characters YAML treats specially.
    y << "  - match: " << quoted(rule.pattern) << "\n";
    std::vector<std::string> dims;
    for (const auto& dim : rule.layout) dims.push_back(dim ? scalar(*dim) : "null");
    y << "    layout: [" << join(dims, ", ") << "]\n";
    for (const auto& [key, opt] : rule.options) y << "    " << key << ": " << scalar(opt.value) << "\n";
  }
  return y.str();
}

}  // namespace shardplan
