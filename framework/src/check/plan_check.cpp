#include "shardplan/plan_check.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "shardplan/error.h"
#include "shardplan/shard.h"

namespace shardplan {

namespace {

std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + json_str(items[i]);
  return out + "]";
}


int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

uint64_t PlanCheck::max_step_bytes() const {
  uint64_t m = 0;
  for (const auto& s : step_comm) m = std::max(m, s.bytes);
  return m;
}

std::string PlanCheck::table() const {
  std::ostringstream os;
  os << "plan " << plan_file << " for " << subject << " at world size " << world_size << "\n";
  if (!report.rows.empty() || !report.warnings.empty()) os << report.table();
  if (!rank_bytes.empty()) {
    os << "parameter bytes per rank:";
    for (size_t r = 0; r < rank_bytes.size(); ++r) os << (r ? ", " : " ") << "rank " << r << " " << rank_bytes[r];
    os << " (unsharded " << report.global_bytes() << ")\n";
  }
  if (!step_comm.empty()) {
    os << "communicated per training step (forward + backward), measured on a dry run with batch " << batch << ":";
    for (size_t r = 0; r < step_comm.size(); ++r)
      os << (r ? ", " : " ") << "rank " << r << " " << step_comm[r].bytes << " bytes in " << step_comm[r].calls
         << " calls";
    os << "\n";
  }
  for (const auto& n : notes) os << "note: " << n << "\n";
  for (const auto& e : errors) os << "error: " << e << "\n";
  if (ok())
    os << "result: ok\n";
  else
    os << "result: the plan cannot run (" << errors.size() << (errors.size() == 1 ? " error" : " errors") << ")\n";
  return os.str();
}

std::string PlanCheck::json() const {
  std::ostringstream os;
  os << "{\n  \"plan\": " << json_str(plan_file) << ",\n  \"subject\": " << json_str(subject)
     << ",\n  \"world_size\": " << world_size << ",\n  \"ok\": " << (ok() ? "true" : "false")
     << ",\n  \"plugins_consulted\": " << (plugins_consulted ? "true" : "false") << ",\n  \"errors\": "
     << json_list(errors) << ",\n  \"notes\": " << json_list(notes) << ",\n  \"rank_bytes\": [";
  for (size_t r = 0; r < rank_bytes.size(); ++r) os << (r ? ", " : "") << rank_bytes[r];
  os << "],\n  \"step_comm\": ";
  if (step_comm.empty()) {
    os << "null";
  } else {
    os << "{\"batch\": " << json_str(batch) << ", \"method\": \"dry run\", \"max_bytes\": " << max_step_bytes()
       << ", \"per_rank\": [";
    for (size_t r = 0; r < step_comm.size(); ++r)
      os << (r ? ", " : "") << "{\"rank\": " << r << ", \"bytes\": " << step_comm[r].bytes
         << ", \"calls\": " << step_comm[r].calls << "}";
    os << "]}";
  }
  std::string rep = report.json();
  std::string indented;
  for (char c : rep) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
  os << ",\n  \"report\": " << indented << "\n}\n";
  return os.str();
}

PlanCheck check_plan_for_model(torch::nn::Module& model, const Plan& plan, int world_size) {
  PlanCheck out;
  out.plan_file = plan.source;
  out.world_size = world_size;
  out.report.world_size = world_size;
  try {
    out.report = check_plan(model, plan, world_size, 0, out.errors);
  } catch (const Error& e) {
    out.errors.push_back(e.what());
    return out;
  }
  // Modules planned by one rule often fail alike, with the same message.
  std::vector<std::string> unique;
  for (auto& e : out.errors)
    if (std::find(unique.begin(), unique.end(), e) == unique.end()) unique.push_back(std::move(e));
  out.errors = std::move(unique);
  if (!out.ok()) return out;
  // Uneven shards (a vocabulary the axis does not divide) differ by rank.
  out.rank_bytes.push_back(out.report.local_bytes());
  for (int r = 1; r < world_size; ++r) out.rank_bytes.push_back(check_plan(model, plan, world_size, r).local_bytes());
  return out;
}

PlanCheck check_plan_for_shapes(const std::vector<TensorShape>& tensors, const Plan& plan, int world_size) {
  PlanCheck out;
  out.plan_file = plan.source;
  out.world_size = world_size;
  out.plugins_consulted = false;
  out.notes.push_back(
      "names and shapes only: module types are unknown, so no layer plugin was consulted (heads, LSTM gates, "
      "options, modules without parameters such as losses, and tied parameters are not checked)");
  if (!plan.recompute.empty())
    out.notes.push_back("recompute: not checked here (which modules exist, and whether they can recompute, is known "
                        "only from the model)");
  out.report.world_size = world_size;
  // A rule for a loss cannot match anything here, so an unmatched rule is
  // only a warning.
  Plan lenient = plan;
  lenient.strict = false;
  std::vector<ParamInfo> infos;
  for (const auto& t : tensors) infos.push_back({t.path, t.shape});
  PlanMatch match;
  try {
    match = lenient.assign(infos, world_size, {}, &out.errors);
  } catch (const Error& e) {
    out.errors.push_back(e.what());
    return out;
  }
  ParallelReport& rep = out.report;
  rep.mesh = match.mesh;
  rep.plan_yaml = plan.to_yaml();
  for (const auto& w : match.warnings)
    rep.warnings.push_back(w + " in the state dict (a rule for a module without parameters cannot be checked here)");
  out.rank_bytes.assign(static_cast<size_t>(world_size), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Assignment& a = match.params[i];
    ReportRow row;
    row.path = a.path;
    row.rule = a.rule ? a.rule->loc.str() : "";
    row.layout = layout_str(a.layout);
    row.note = a.rule ? "" : "replicated, unmatched";
    row.global_shape = a.shape;
    row.element_size = tensors[i].element_size;
    int64_t blocks = 1;
    if (const RuleOption* o = a.rule ? a.rule->option("blocks") : nullptr) blocks = std::stoll(o->value);
    // As the dense plugin reads `blocks`: the first split dim is k stacked
    // blocks, each split alike.
    bool first_split = true;
    for (size_t d = 0; d < a.layout.size(); ++d) {
      if (!a.layout[d]) continue;
      const int64_t b = first_split ? blocks : 1;
      first_split = false;
      const int parts = rep.mesh.axis_size(*a.layout[d]);
      const std::string where = " (rule at " + row.rule + ")";
      if (a.shape[d] % b != 0) {
        out.errors.push_back(a.rule->option("blocks")->loc.str() + ": parameter '" + a.path + "': dim " +
                             std::to_string(d) + " (size " + std::to_string(a.shape[d]) + ") is not " +
                             std::to_string(b) + " equal blocks");
      } else if ((a.shape[d] / b) % parts != 0) {
        rep.warnings.push_back("parameter '" + a.path + "'" + where + ": dim " + std::to_string(d) + " (size " +
                               std::to_string(a.shape[d]) + (b > 1 ? ", " + std::to_string(b) + " blocks" : "") +
                               ") does not divide evenly among the " + std::to_string(parts) + " ranks of axis '" +
                               *a.layout[d] + "'; only layers that accept uneven shards (a vocab-parallel "
                               "Embedding) can run this");
      }
    }
    for (int r = 0; r < world_size; ++r) {
      std::vector<int64_t> local = a.shape;
      first_split = true;
      for (size_t d = 0; d < a.layout.size(); ++d) {
        if (!a.layout[d]) continue;
        const int64_t b = first_split && a.shape[d] % blocks == 0 ? blocks : 1;
        first_split = false;
        const auto range = shard_range(a.shape[d] / b, rep.mesh.axis_size(*a.layout[d]), rep.mesh.coord(r, *a.layout[d]));
        local[d] = (range.second - range.first) * b;
      }
      if (r == 0) row.local_shape = local;
      out.rank_bytes[static_cast<size_t>(r)] += numel(local) * row.element_size;
    }
    rep.rows.push_back(std::move(row));
  }
  if (!out.ok()) out.rank_bytes.clear();
  return out;
}

}  // namespace shardplan
