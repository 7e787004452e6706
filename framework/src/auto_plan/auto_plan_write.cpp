// auto_plan's mesh and its rules written as a plan (auto_plan_write.h).
#include "auto_plan_write.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "plan/plan_internal.h"
#include "shardplan/error.h"
#include "shardplan/mesh.h"

namespace shardplan {
namespace auto_detail {
namespace {

std::string ranks(int n) { return std::to_string(n) + " rank" + (n == 1 ? "" : "s"); }

std::string escape(const std::string& path) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : path) {
    if (special.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// "blocks.0.fc1.weight" -> "blocks\.\d+\.fc1\.weight".
std::string generalized(const std::string& path) {
  std::string out;
  size_t i = 0;
  while (i < path.size()) {
    const bool at_start = i == 0 || path[i - 1] == '.';
    size_t j = i;
    while (j < path.size() && std::isdigit(static_cast<unsigned char>(path[j]))) ++j;
    if (at_start && j > i && (j == path.size() || path[j] == '.')) {
      out += R"(\d+)";
      i = j;
    } else {
      out += escape(std::string(1, path[i]));
      ++i;
    }
  }
  return out;
}

// "blocks.0.fc1 of blocks.0" -> "blocks.N.fc1 of blocks.N": a block index
// between dots after a word character (what std::regex_replace did with
// (\w)\.\d+\. -> $1.N., as one scan: paths may come from a model file).
std::string numbered_blocks(const std::string& text) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    size_t j = i + 2;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (word(text[i]) && i + 1 < text.size() && text[i + 1] == '.' && j > i + 2 && j < text.size() && text[j] == '.') {
      out += ".N.";
      i = j;
    }
  }
  return out;
}

// The mesh text parsed as a plan's mesh, so that it is read exactly as a
// plan file's would be; errors lose the synthetic document's location.
Plan parse_mesh(const std::string& text) {
  const std::string like = "a YAML flow map such as {data: 2, model: auto}";
  if (text.find_first_of("\r\n") != std::string::npos)
    throw Error("auto_plan: mesh '" + text + "' must be one line, " + like);
  try {
    return parse_plan("version: 1\nmesh: " + text + "\nrules: []\n", "<mesh>");
  } catch (const PlanError& e) {
    throw Error("auto_plan: mesh '" + text + "' is not " + like + ": " + e.message());
  }
}

}  // namespace

std::string MeshChoice::describe() const {
  if (batch_axis.empty()) return ranks(world_size) + " over '" + axis + "'";
  return ranks(world_size) + ", mesh " + spec + ": rules over '" + axis + "' (" + ranks(axis_size) +
         "), the batch split over '" + batch_axis + "'";
}

std::string MeshChoice::at_ranks() const {
  if (batch_axis.empty()) return "at " + ranks(world_size);
  return "at " + std::to_string(axis_size) + " '" + axis + "' rank" + (axis_size == 1 ? "" : "s") + " (of " +
         std::to_string(world_size) + ")";
}

MeshChoice choose_mesh(const AutoPlanOptions& options, int world_size) {
  if (world_size < 1) throw Error("auto_plan: world size " + std::to_string(world_size) + " (must be at least 1)");
  if (options.axis.empty()) throw Error("auto_plan: empty axis name");
  MeshChoice m;
  m.axis = options.axis;
  m.world_size = world_size;
  if (options.mesh.empty()) {
    m.spec = "{" + options.axis + ": auto}";
    m.axis_size = world_size;
    return m;
  }
  const Plan p = parse_mesh(options.mesh);
  Mesh mesh;
  try {
    mesh = p.resolve_mesh(world_size);
  } catch (const PlanError& e) {
    throw Error("auto_plan: " + e.message());
  }
  m.spec = plan_detail::mesh_spec_str(p.mesh);
  if (!mesh.has_axis(options.axis))
    throw Error("auto_plan: mesh " + m.spec + " has no axis '" + options.axis +
                "' to shard over (AutoPlanOptions::axis)");
  std::vector<std::string> others;
  for (const auto& [name, size] : mesh.axes())
    if (name != options.axis) others.push_back(name);
  // One model axis and one batch axis is what auto_plan plans; a third axis
  // would need a decision (pipeline? a second model axis?) it cannot make.
  if (others.size() > 1)
    throw Error("auto_plan: mesh " + m.spec + " has " + std::to_string(others.size()) + " axes besides '" +
                options.axis + "' (" + plan_detail::join(others, ", ") +
                "); auto_plan plans a model axis and at most one batch axis");
  m.axis_size = mesh.axis_size(options.axis);
  if (!others.empty()) m.batch_axis = others[0];
  return m;
}

Plan write_plan(const std::vector<const AutoPlanRule*>& specs, std::vector<std::string> universe,
                const MeshChoice& mesh) {
  for (const AutoPlanRule* r : specs)
    if (std::find(universe.begin(), universe.end(), r->path) == universe.end()) universe.push_back(r->path);
  struct Out {
    std::string pattern;
    const AutoPlanRule* spec;
    std::set<std::string> members;
  };
  std::vector<Out> outs;
  auto key_of = [](const AutoPlanRule& r) {
    std::string k = layout_str(r.layout);
    for (const auto& [o, v] : r.options) k += "|" + o + "=" + v;
    return k;
  };
  std::map<std::pair<std::string, std::string>, size_t> grouped;
  for (const AutoPlanRule* r : specs) {
    const auto key = std::make_pair(generalized(r->path), key_of(*r));
    auto it = grouped.find(key);
    if (it == grouped.end()) {
      grouped[key] = outs.size();
      outs.push_back({key.first, r, {r->path}});
    } else {
      outs[it->second].members.insert(r->path);
    }
  }
  std::vector<Out> rules;
  for (Out& o : outs) {
    Rule rule;
    rule.pattern = o.pattern;
    rule.matcher = plan_detail::compile(o.pattern, SourceLoc{"<auto_plan>"});
    bool exact = true;
    for (const auto& path : universe)
      if (rule.matches(path) != (o.members.count(path) > 0)) exact = false;
    if (exact) {
      rules.push_back(o);
      continue;
    }
    for (const AutoPlanRule* r : specs)
      if (o.members.count(r->path)) rules.push_back({escape(r->path), r, {r->path}});
  }
  std::ostringstream y;
  y << "version: 1\nmesh: " << mesh.spec << "\n";
  // The other axis splits the batch (data parallelism, as plans/gpt_2d.yaml);
  // named even when it is `data`, so that the plan says what it does.
  if (!mesh.batch_axis.empty()) y << "batch_axis: " << mesh.batch_axis << "\n";
  y << "rules:" << (rules.empty() ? " []" : "") << "\n";
  for (const Out& o : rules) {
    y << "  - match: " << plan_detail::quoted(o.pattern) << "\n    layout: " << layout_str(o.spec->layout) << "\n";
    for (const auto& [k, v] : o.spec->options) y << "    " << k << ": " << v << "\n";
  }
  Plan p = parse_plan(y.str(), "<auto_plan>");
  // A rule for several blocks speaks of block N, not of the first.
  for (size_t i = 0; i < rules.size(); ++i)
    p.rules[i].comment = rules[i].members.size() > 1 ? numbered_blocks(rules[i].spec->why) : rules[i].spec->why;
  return p;
}

bool mentions(const std::string& text, const std::string& path) {
  for (size_t at = text.find(path); at != std::string::npos; at = text.find(path, at + 1)) {
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
    const bool before = at == 0 || !word(text[at - 1]);
    const size_t end = at + path.size();
    const bool after = end >= text.size() || !word(text[end]) ||
                       (text[end] == '.' && end + 1 < text.size() && !word(text[end + 1]));
    if (before && after) return true;
  }
  return false;
}

}  // namespace auto_detail
}  // namespace shardplan
