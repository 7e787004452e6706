// A plan from a checkpoint's names and shapes alone (`shardplan plan auto
// --state-dict`). Nothing runs, so who feeds whom is a guess; only the
// obvious one is made: under one module, consecutive Linear-shaped layers
// (a 2-D weight, maybe a bias) of weights [h, d] (one or several: a gated
// MLP's gate and up) followed at once by one of [d, h] are an MLP, paired
// the Megatron way. h != d, or the shapes could not tell the direction
// (attention's square projections would pair with each other). Each rule
// says it was inferred, and that `shardplan plan check` should be run.
#include <map>

#include "torchscript_plan.h"

namespace shardplan_plan {
namespace {

struct Module {
  std::string path;                // "blocks.0.fc1"
  std::vector<int64_t> weight;     // empty: not Linear-shaped
  bool bias = false;
  bool linear() const { return weight.size() == 2; }
};

std::string parent_of(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string dims(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The modules holding parameters, in the file's order, grouped by parent.
std::map<std::string, std::vector<Module>> siblings(const StateDictShapes& shapes) {
  std::map<std::string, std::vector<Module>> out;
  std::map<std::string, std::pair<std::string, size_t>> where;  // module -> (parent, index)
  std::map<std::string, bool> odd;                              // has parameters a Linear has not
  for (const auto& t : shapes.params) {
    const std::string mod = parent_of(t.path), leaf = t.path.substr(mod.empty() ? 0 : mod.size() + 1);
    if (!where.count(mod)) {
      auto& list = out[parent_of(mod)];
      where[mod] = {parent_of(mod), list.size()};
      list.push_back({mod, {}, false});
    }
    Module& m = out[where[mod].first][where[mod].second];
    if (leaf == "weight" && t.shape.size() == 2) m.weight = t.shape;
    else if (leaf == "bias" && t.shape.size() == 1) m.bias = true;
    else odd[mod] = true;
  }
  for (auto& [parent, list] : out)
    for (Module& m : list)
      if (odd[m.path] || (m.bias && m.weight.empty())) m.weight.clear();
  return out;
}

std::string weight_of(const std::string& module) { return module.empty() ? "weight" : module + ".weight"; }
std::string bias_of(const std::string& module) { return module.empty() ? "bias" : module + ".bias"; }

shardplan::AutoPlanUnit unit(const std::vector<Module>& list, size_t first, size_t row, const std::string& axis,
                             const std::string& file) {
  const std::string guess = " (inferred from names and shapes only in " + file +
                            ": run `shardplan plan check` with the model before training)";
  shardplan::AutoPlanUnit u;
  std::string names;
  for (size_t i = first; i < row; ++i) {
    const Module& a = list[i];
    names += (names.empty() ? "" : " and ") + a.path;
    u.layers.push_back(a.path);
    u.rules.push_back({weight_of(a.path), {axis, std::nullopt}, {{"output", "sharded"}},
                       "column-parallel " + a.path + " " + dims(a.weight) + ", output left split for " +
                           list[row].path + " " + dims(list[row].weight) + guess});
    if (a.bias) u.rules.push_back({bias_of(a.path), {axis}, {}, "follows " + a.path + "'s outputs"});
  }
  u.layers.push_back(list[row].path);
  u.rules.push_back({weight_of(list[row].path), {std::nullopt, axis}, {{"input", "sharded"}},
                     "row-parallel " + list[row].path + ": reads the split output of " + names +
                         "; its partial sums are all-reduced once" + guess});
  return u;
}

}  // namespace

shardplan::Plan plan_state_dict(const StateDictShapes& shapes, const std::string& file, int world_size,
                                const shardplan::AutoPlanOptions& options) {
  std::vector<shardplan::AutoPlanUnit> units;
  for (const auto& [parent, list] : siblings(shapes)) {
    for (size_t i = 0; i < list.size();) {
      size_t j = i;
      while (j < list.size() && list[j].linear() && list[j].weight == list[i].weight) ++j;
      const bool mlp = j > i && j < list.size() && list[j].linear() && list[i].weight[0] != list[i].weight[1] &&
                       list[j].weight[0] == list[i].weight[1] && list[j].weight[1] == list[i].weight[0];
      if (mlp) units.push_back(unit(list, i, j, options.axis, file));
      i = mlp ? j + 1 : std::max(j, i + 1);
    }
  }
  std::vector<shardplan::ParamInfo> params;
  for (const auto& t : shapes.params) params.push_back({t.path, t.shape});
  const std::vector<std::string> lines = {
      "(names and shapes only: a pair is inferred for consecutive [h, d] then [d, h] weights of one module; "
      "attention, embeddings, convolutions and whatever else cannot be told from shapes stay replicated)"};
  return shardplan::auto_plan_for_units(params, units, lines, world_size, options,
                                        "from the names and shapes of " + file + " only");
}

}  // namespace shardplan_plan
