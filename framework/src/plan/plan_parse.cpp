#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "plan_data_parallel.h"
#include "plan_divide.h"
#include "plan_pipeline.h"
#include "plan_recompute.h"
#include "plan_sequence_parallel.h"
#include "plan_internal.h"
#include "base/utf8.h"

namespace shardplan {
namespace fs = std::filesystem;

namespace {

using plan_detail::compile;
using plan_detail::join;
using plan_detail::parse_positive_int;

const char* kind_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

// yaml-cpp's tree takes 50 to 150 times the text, and plans are a few KiB:
// a huge one is refused before it can exhaust memory.
void check_size(const std::string& source, uintmax_t bytes) {
  if (bytes > kMaxPlanBytes)
    throw PlanError(SourceLoc{source, 0, 0}, "the plan is " + std::to_string(bytes) +
                                                 " bytes; a plan may have at most " + std::to_string(kMaxPlanBytes) +
                                                 " (1 MiB)");
}

class Parser {
 public:
  Parser(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  Plan parse(const std::string& yaml) {
    check_size(source_, yaml.size());
    YAML::Node root;
    try {
      root = YAML::Load(yaml);
    } catch (const YAML::ParserException& e) {
      throw PlanError(at(e.mark), "invalid YAML: " + e.msg);
    }
    const SourceLoc top{source_, 1, 1};
    if (!root.IsDefined() || root.IsNull())
      throw PlanError(top, "the plan is empty; expected a map with mesh and rules");
    if (!root.IsMap())
      throw PlanError(at(root, top),
                      std::string("a plan must be a map with mesh and rules, got ") + kind_name(root));

    Plan plan;
    plan.source = source_;
    std::optional<Entry> mesh, rules;
    for (const Entry& e : entries(root, "", kTopKeys)) {
      if (e.key == "version")
        parse_version(e, plan);
      else if (e.key == "mesh")
        mesh = e;
      else if (e.key == "plugins")
        parse_plugins(e, plan);
      else if (e.key == "strict")
        parse_strict(e, plan);
      else if (e.key == "paths")
        parse_paths(e, plan);
      else if (e.key == "rules")
        rules = e;
      else if (e.key == "batch_axis")
        detail::parse_batch_axis(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "data_parallel")
        detail::parse_data_parallel(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "sequence_parallel")
        detail::parse_sequence_parallel(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "divide")
        detail::parse_divide(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "recompute")
        detail::parse_recompute(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "pipeline")
        detail::parse_pipeline(e.value, at(e.value, e.key_loc), plan);
      else if (!e.value.IsScalar() && !e.value.IsNull())  // name, description
        throw PlanError(at(e.value, e.key_loc), e.key + " must be text, got " + kind_name(e.value));
      else if (e.value.IsScalar())
        text(e.value, at(e.value, e.key_loc), e.key);
    }
    const SourceLoc root_loc = at(root, top);
    if (!mesh) throw PlanError(root_loc, "missing 'mesh' (e.g. mesh: {model: auto})");
    if (!rules) throw PlanError(root_loc, "missing 'rules' (a list of {match: <regex>, layout: [...]})");
    parse_mesh(*mesh, plan);
    detail::check_batch_axis(plan);
    parse_rules(*rules, plan);
    detail::check_sequence_parallel(plan);
    detail::check_pipeline(plan);
    return plan;
  }

 private:
  struct Entry {
    std::string key;
    SourceLoc key_loc;
    YAML::Node value;
  };

  inline static const std::vector<std::string> kTopKeys = {
      "version", "mesh",         "plugins",           "strict", "paths",      "batch_axis",
      "data_parallel", "sequence_parallel", "divide", "recompute", "pipeline", "rules", "name", "description"};
  inline static const std::vector<std::string> kRuleKeys = {"match", "layout", "output",
                                                            "input", "blocks", "plugin",
                                                            "sequence_parallel", "sequence_dim", "overlap",
                                                            "head_dim",          "replicate_heads"};

  // A scalar's text. YAML is UTF-8, and yaml-cpp writes anything else back
  // as U+FFFD, so a name that is not would change in the plan's canonical
  // form (and in a checkpoint's copy of it, which refuses it): refused here
  // as the checkpoint metadata refuses it.
  const std::string& text(const YAML::Node& n, const SourceLoc& loc, const std::string& what) const {
    if (!detail::valid_utf8(n.Scalar())) throw PlanError(loc, what + " is not valid UTF-8");
    return n.Scalar();
  }

  SourceLoc at(const YAML::Mark& m) const {
    if (m.is_null()) return SourceLoc{source_, 0, 0};
    return SourceLoc{source_, m.line + 1, m.column + 1};
  }
  // A null value's mark points at whatever token follows it, so such values
  // are reported at their key instead.
  SourceLoc at(const YAML::Node& n, const SourceLoc& key_loc) const {
    if (n.IsNull() || n.Mark().is_null()) return key_loc;
    return at(n.Mark());
  }

  // The map's entries, in order, after rejecting non-string, duplicate and
  // unknown keys. `where` completes messages: "" or " in rule".
  std::vector<Entry> entries(const YAML::Node& map, const std::string& where,
                             const std::vector<std::string>& known) const {
    std::vector<Entry> out;
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const SourceLoc key_loc = at(it->first.Mark());
      if (!it->first.IsScalar())
        throw PlanError(key_loc, "keys" + where + " must be names, got " + kind_name(it->first));
      const std::string key = text(it->first, key_loc, "a key" + where);
      if (std::find(known.begin(), known.end(), key) == known.end())
        throw PlanError(key_loc,
                        "unknown key '" + key + "'" + where + " (expected " + join(known, ", ") + ")");
      if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "'" + where);
      out.push_back({key, key_loc, it->second});
    }
    return out;
  }

  void parse_version(const Entry& e, Plan& plan) const {
    if (!e.value.IsScalar() || e.value.Scalar() != "1")
      throw PlanError(at(e.value, e.key_loc),
                      "unsupported version " +
                          (e.value.IsScalar() ? "'" + e.value.Scalar() + "'" : kind_name(e.value)) +
                          " (this shardplan reads version 1)");
    plan.version = 1;
  }

  void parse_paths(const Entry& e, Plan& plan) const {
    const SourceLoc loc = at(e.value, e.key_loc);
    if (!e.value.IsScalar() || (e.value.Scalar() != "torch" && e.value.Scalar() != "keras"))
      throw PlanError(loc, "paths must be torch (named_parameters() keys, torch layouts) or keras "
                           "(dense/kernel, layouts in Keras's axis order)");
    plan.paths = e.value.Scalar();
    plan.paths_loc = loc;
  }

  void parse_strict(const Entry& e, Plan& plan) const {
    bool value = true;
    if (!e.value.IsScalar() || !YAML::convert<bool>::decode(e.value, value))
      throw PlanError(at(e.value, e.key_loc), "strict must be true or false");
    plan.strict = value;
  }

  void parse_plugins(const Entry& e, Plan& plan) const {
    const char* expected =
        "plugins must be a list of directories, e.g. plugins: [../build/lib/shardplan/plugins]";
    if (!e.value.IsSequence()) throw PlanError(at(e.value, e.key_loc), expected);
    for (const auto& dir : e.value) {
      const SourceLoc loc = at(dir, e.key_loc);
      if (!dir.IsScalar() || dir.Scalar().empty()) throw PlanError(loc, expected);
      fs::path p(text(dir, loc, "a plugin directory"));
      // Relative to the plan file, so a plan and its plugins can move together.
      if (p.is_relative()) p = fs::absolute(fs::path(base_dir_) / p);
      plan.plugin_dirs.push_back(p.lexically_normal().string());
      plan.plugin_dir_locs.push_back(loc);
    }
  }

  void parse_mesh(const Entry& e, Plan& plan) const {
    plan.mesh_loc = at(e.value, e.key_loc);
    if (!e.value.IsMap())
      throw PlanError(plan.mesh_loc,
                      std::string("mesh must be a map of axis name to size, e.g. {model: auto}; got ") +
                          kind_name(e.value));
    if (e.value.size() == 0) throw PlanError(plan.mesh_loc, "mesh must name at least one axis");
    std::optional<std::string> auto_axis;
    for (auto it = e.value.begin(); it != e.value.end(); ++it) {
      MeshAxisSpec axis;
      axis.loc = at(it->first.Mark());
      if (!it->first.IsScalar() || it->first.Scalar().empty())
        throw PlanError(axis.loc, "mesh axis names must be non-empty names");
      axis.name = text(it->first, axis.loc, "a mesh axis name");
      for (const auto& other : plan.mesh)
        if (other.name == axis.name) throw PlanError(axis.loc, "duplicate axis '" + axis.name + "' in mesh");
      const SourceLoc size_loc = at(it->second, axis.loc);
      const std::string size = it->second.IsScalar() ? it->second.Scalar() : "";
      if (size == "auto") {
        if (auto_axis)
          throw PlanError(size_loc, "axis '" + axis.name + "' is auto but '" + *auto_axis +
                                        "' already is; at most one mesh axis can be auto");
        axis.size = MeshAxisSpec::kAutoSize;
      } else if (auto n = parse_positive_int(size)) {
        axis.size = *n;
      } else {
        throw PlanError(size_loc, "mesh axis '" + axis.name +
                                      "' must have an integer size >= 1 or auto, got " +
                                      (it->second.IsScalar() ? "'" + size + "'" : kind_name(it->second)));
      }
      if (axis.size == MeshAxisSpec::kAutoSize) auto_axis = axis.name;
      plan.mesh.push_back(axis);
    }
  }

  void parse_rules(const Entry& e, Plan& plan) const {
    if (!e.value.IsSequence())
      throw PlanError(
          at(e.value, e.key_loc),
          std::string("rules must be a list of {match: <regex>, layout: [...]}; got ") + kind_name(e.value));
    std::vector<std::string> axes;
    for (const auto& a : plan.mesh) axes.push_back(a.name);
    for (const auto& node : e.value) {
      Rule rule;
      rule.index = plan.rules.size();
      rule.loc = at(node, at(e.value.Mark()));
      // Each rule holds a compiled pattern (a few KiB); generated plans have
      // hundreds at most.
      if (plan.rules.size() == kMaxPlanRules)
        throw PlanError(rule.loc, "more than " + std::to_string(kMaxPlanRules) +
                                      " rules; a plan may have at most that many");
      const std::string name = "rule " + std::to_string(rule.index + 1);
      if (!node.IsMap())
        throw PlanError(rule.loc, name + " must be a map with match and layout, got " + kind_name(node));
      std::optional<Entry> match, layout;
      for (const Entry& field : entries(node, " in rule", kRuleKeys)) {
        if (field.key == "match")
          match = field;
        else if (field.key == "layout")
          layout = field;
        else
          parse_option(field, rule);
      }
      if (!match) throw PlanError(rule.loc, name + " has no 'match' (a regex over parameter names)");
      if (!layout) throw PlanError(rule.loc, name + " has no 'layout' (a mesh axis or null per tensor dim)");

      rule.pattern_loc = at(match->value, match->key_loc);
      if (!match->value.IsScalar())
        throw PlanError(rule.pattern_loc,
                        "match must be a regex string, got " + std::string(kind_name(match->value)));
      rule.pattern = text(match->value, rule.pattern_loc, "match");
      rule.matcher = compile(rule.pattern, rule.pattern_loc);

      rule.layout_loc = at(layout->value, layout->key_loc);
      rule.layout = parse_layout(*layout, axes);
      plan.rules.push_back(std::move(rule));
    }
  }

  Layout parse_layout(const Entry& e, const std::vector<std::string>& axes) const {
    if (!e.value.IsSequence())
      throw PlanError(at(e.value, e.key_loc),
                      std::string("layout must be a list with a mesh axis or null per tensor dim, "
                                  "e.g. [model, null]; got ") +
                          kind_name(e.value));
    Layout layout;
    for (const auto& entry : e.value) {
      const SourceLoc loc = at(entry.Mark());
      if (entry.IsNull()) {
        layout.push_back(std::nullopt);
        continue;
      }
      if (!entry.IsScalar())
        throw PlanError(
            loc, std::string("layout entries must be a mesh axis name or null, got ") + kind_name(entry));
      const std::string axis = text(entry, loc, "a layout entry");
      if (std::find(axes.begin(), axes.end(), axis) == axes.end())
        throw PlanError(loc, "unknown axis '" + axis + "' in layout; mesh axes are: " + join(axes, ", "));
      for (const auto& prev : layout)
        if (prev == axis)
          throw PlanError(loc, "axis '" + axis +
                                   "' appears twice in layout; a tensor can be split over an axis only once");
      layout.push_back(axis);
    }
    return layout;
  }

  // The options the kernel's layers understand, checked here so a typo fails
  // when the plan is loaded rather than when some plugin first reads it.
  void parse_option(const Entry& e, Rule& rule) const {
    const SourceLoc loc = at(e.value, e.key_loc);
    if (e.value.IsScalar()) text(e.value, loc, e.key);
    const std::string got = e.value.IsScalar() ? "'" + e.value.Scalar() + "'" : kind_name(e.value);
    const std::string value = e.value.IsScalar() ? e.value.Scalar() : "";
    auto require = [&](bool ok, const std::string& expected) {
      if (!ok) throw PlanError(loc, e.key + " must be " + expected + ", got " + got);
    };
    if (e.key == "output")
      require(value == "sharded" || value == "gathered", "sharded or gathered");
    else if (e.key == "input")
      require(value == "sharded" || value == "replicated", "sharded or replicated");
    else if (e.key == "blocks")
      require(parse_positive_int(value).has_value(), "an integer >= 1");
    else if (e.key == "head_dim")
      require(value == "auto" || parse_positive_int(value).has_value(), "an integer >= 1 or auto (the model's)");
    else if (e.key == "replicate_heads")
      require(value == "true" || value == "false", "true or false");
    else if (e.key == "overlap")
      require(value == "none" || value == "ring" || value == "ring_bidirectional" || value == "ring_split",
              "none, ring, ring_bidirectional or ring_split");
    else if (e.key == "plugin")
      // A name, never a path: which libraries a plan may load is the user's
      // choice (PluginLoader), not the plan's.
      require(e.value.IsScalar() && is_plugin_name(value),
              "a plugin name (letters, digits, '_', '-', '.'), e.g. dense");
    else if (e.key == "sequence_parallel" || e.key == "sequence_dim") {
      const std::string expected = detail::sequence_option_error(e.key, value);
      require(e.value.IsScalar() && expected.empty(), expected);
    }
    rule.options[e.key] = RuleOption{value, loc};
  }

  std::string source_;
  std::string base_dir_;
};

}  // namespace

Plan parse_plan(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir) {
  return Parser(source_name, fs::absolute(base_dir).lexically_normal().string()).parse(yaml_text);
}

Plan load_plan(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("plan file '" + path + "' not found");
  if (fs::is_directory(path, ec)) throw Error("plan file '" + path + "' is a directory");
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec) check_size(path, size);  // before reading it (a fifo or device has no size: read, then checked)
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read plan file '" + path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("cannot read plan file '" + path + "'");
  return parse_plan(text, path, fs::absolute(path).parent_path().string());
}

}  // namespace shardplan
