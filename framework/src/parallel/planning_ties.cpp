// Tied parameters (one tensor in several modules) at planning time: they are
// sliced once, so every use must be planned alike.
#include <string>
#include <unordered_map>

#include "shardplan/error.h"
#include "plan/plan_internal.h"
#include "planning.h"

namespace shardplan::parallel_detail {

using plan_detail::shape_str;

namespace {

std::string blocks(const Planning& st, size_t i) {
  const RuleOption* o = st.rule_of[i] ? st.rule_of[i]->option("blocks") : nullptr;
  return o ? o->value : std::string("1");
}

// Same layout, same `blocks`, same local shape.
bool planned_alike(const Planning& st, size_t f, size_t i) {
  const ReportRow& a = st.out.rows[f];
  const ReportRow& b = st.out.rows[i];
  return a.layout == b.layout && a.local_shape == b.local_shape && blocks(st, f) == blocks(st, i);
}

PlanError tie_error(const Planning& st, size_t f, size_t i) {
  auto desc = [&](size_t k) {
    const ReportRow& r = st.out.rows[k];
    return "'" + r.path + "' (layout " + r.layout + (r.rule.empty() ? ", unmatched" : ", rule at " + r.rule) +
           (blocks(st, k) != "1" ? ", blocks " + blocks(st, k) : std::string()) + ", local shape " +
           shape_str(r.local_shape) + ")";
  };
  const Rule* at = st.rule_of[i] ? st.rule_of[i] : st.rule_of[f];
  return PlanError(at ? at->loc : SourceLoc{}, "tied parameters " + desc(f) + " and " + desc(i) +
                                                   " are one tensor but are planned differently: give both "
                                                   "the same layout (e.g. a vocab-parallel embedding "
                                                   "[model, null] and a column-parallel head [model, null]), "
                                                   "or untie them");
}

}  // namespace

void check_ties(Planning& st) {
  std::unordered_map<const void*, size_t> first_use;  // tensor -> its first parameter
  std::unordered_map<size_t, size_t> tie_of;          // first parameter -> index in out.ties
  const auto& owners = st.scan.owners;
  for (size_t i = 0; i < st.scan.infos.size(); ++i) {
    auto it = first_use.emplace(st.scan.tensor_of[i], i);
    if (it.second) continue;
    const size_t f = it.first->second;
    if (!planned_alike(st, f, i)) {
      const PlanError err = tie_error(st, f, i);
      if (!st.errors) throw err;
      st.errors->push_back(err.what());
    }
    const ReportRow& a = st.out.rows[f];
    ReportRow& b = st.out.rows[i];
    b.tied_to = a.path;
    b.note += (b.note.empty() ? "" : "; ") + std::string("tied to ") + a.path;
    auto t = tie_of.emplace(f, st.out.ties.size());
    if (t.second) st.out.ties.push_back({TieUse{owners[f].first, owners[f].second, a.path}});
    st.out.ties[t.first->second].push_back(TieUse{owners[i].first, owners[i].second, b.path});
  }
}

}  // namespace shardplan::parallel_detail
