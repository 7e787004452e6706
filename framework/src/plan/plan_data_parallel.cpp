#include "plan_data_parallel.h"

#include "plan_internal.h"
#include "base/utf8.h"

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace shardplan {
namespace detail {
using plan_detail::loc_of;

namespace {

bool as_bool(const YAML::Node& n, bool& out) { return n.IsScalar() && YAML::convert<bool>::decode(n, out); }

// `zero: 1|2|3`, or `true` (1) / `false` (0) as before stages existed.
void parse_zero(const YAML::Node& v, const SourceLoc& vloc, DataParallelSpec& dp) {
  bool flag = false;
  const std::string s = v.IsScalar() ? v.Scalar() : "";
  if (s == "0" || s == "1" || s == "2" || s == "3")
    dp.zero = s[0] - '0';
  else if (as_bool(v, flag))
    dp.zero = flag ? 1 : 0;
  else
    throw PlanError(vloc, "data_parallel.zero must be a ZeRO stage 0, 1, 2 or 3 (true is 1, false 0), got '" +
                              (valid_utf8(s) ? s : std::string("<not UTF-8>")) + "'");
  dp.zero_loc = vloc;
}

// bucket_mb, first_bucket_mb: a positive number of MiB, kept as written (for
// to_yaml) in `written`; in bytes, at least 1.
int64_t parse_mib_key(const YAML::Node& v, const SourceLoc& vloc, const std::string& key, std::string& written) {
  double mb = 0;
  size_t used = 0;
  const std::string s = v.IsScalar() ? v.Scalar() : "";
  try {
    mb = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !std::isfinite(mb) || mb <= 0 || mb > 1024 * 1024)
    throw PlanError(vloc, "data_parallel." + key + " must be a positive number of MiB, got '" + s + "'");
  written = s;
  return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024));
}

}  // namespace

void parse_batch_axis(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  if (!value.IsScalar() || value.Scalar().empty())
    throw PlanError(value_loc, "batch_axis must be the name of a mesh axis, e.g. batch_axis: data");
  if (!valid_utf8(value.Scalar())) throw PlanError(value_loc, "batch_axis is not valid UTF-8");
  plan.data_parallel.batch_axis = value.Scalar();
  plan.data_parallel.batch_axis_loc = value_loc;
}

void parse_data_parallel(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  DataParallelSpec& dp = plan.data_parallel;
  dp.loc = value_loc;
  static const char* kKeys = "ignore, bucket_mb, first_bucket_mb, overlap, zero, reduce_dtype";
  if (!value.IsMap())
    throw PlanError(value_loc, std::string("data_parallel must be a map (keys: ") + kKeys +
                                   "), e.g. data_parallel: {ignore: ['.*\\.bias'], zero: true}");
  std::set<std::string> seen;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const SourceLoc key_loc = loc_of(it->first, value_loc);
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const YAML::Node v = it->second;  // a copy: the iterator hands out temporaries
    const SourceLoc vloc = loc_of(v, key_loc);
    if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "' in data_parallel");
    if (key == "ignore") {
      if (!v.IsSequence())
        throw PlanError(vloc, "data_parallel.ignore must be a list of regexes over parameter paths");
      for (const auto& item : v) {
        const SourceLoc iloc = loc_of(item, vloc);
        if (!item.IsScalar() || item.Scalar().empty())
          throw PlanError(iloc, "data_parallel.ignore entries must be regexes over parameter paths");
        if (!valid_utf8(item.Scalar())) throw PlanError(iloc, "data_parallel.ignore entry is not valid UTF-8");
        Rule r;
        r.index = dp.ignore.size();
        r.pattern = item.Scalar();
        r.loc = r.pattern_loc = r.layout_loc = iloc;
        // The rules' checks (length, nesting, syntax): a refused regex fails here, at its line.
        r.matcher = plan_detail::compile(r.pattern, iloc);
        dp.ignore.push_back(std::move(r));
      }
    } else if (key == "bucket_mb") {
      dp.bucket_bytes = parse_mib_key(v, vloc, key, dp.bucket_mb);
    } else if (key == "first_bucket_mb") {
      dp.first_bucket_bytes = parse_mib_key(v, vloc, key, dp.first_bucket_mb);
    } else if (key == "overlap") {
      if (!as_bool(v, dp.overlap)) throw PlanError(vloc, "data_parallel.overlap must be true or false");
    } else if (key == "zero") {
      parse_zero(v, vloc, dp);
    } else if (key == "reduce_dtype") {
      static const std::set<std::string> kDtypes = {"float32", "bfloat16", "float16", "float64"};
      const std::string s = v.IsScalar() ? v.Scalar() : "";
      if (!kDtypes.count(s))
        throw PlanError(vloc, "data_parallel.reduce_dtype must be float32, bfloat16, float16 or float64, got '" +
                                  (valid_utf8(s) ? s : std::string("<not UTF-8>")) + "'");
      dp.reduce_dtype = s;
      dp.reduce_dtype_loc = vloc;
    } else {
      throw PlanError(key_loc, "unknown key '" + key + "' in data_parallel (expected " + kKeys + ")");
    }
  }
}

void check_batch_axis(const Plan& plan) {
  const auto& dp = plan.data_parallel;
  if (dp.batch_axis.empty()) return;
  std::string axes;
  for (const auto& a : plan.mesh) {
    if (a.name == dp.batch_axis) return;
    axes += (axes.empty() ? "" : ", ") + a.name;
  }
  throw PlanError(dp.batch_axis_loc, "batch_axis '" + dp.batch_axis + "' is not a mesh axis; mesh axes are: " + axes);
}

std::string data_parallel_yaml(const Plan& plan) {
  const auto& dp = plan.data_parallel;
  std::ostringstream y;
  if (!dp.batch_axis.empty()) {
    YAML::Emitter e;
    e << dp.batch_axis;
    y << "batch_axis: " << e.c_str() << "\n";
  }
  const DataParallelSpec defaults;
  if (dp.ignore.empty() && dp.bucket_bytes == defaults.bucket_bytes &&
      dp.first_bucket_bytes == defaults.first_bucket_bytes && dp.overlap == defaults.overlap &&
      dp.zero == defaults.zero && dp.reduce_dtype.empty())
    return y.str();
  std::vector<std::string> items;
  if (!dp.ignore.empty()) {
    // Quoted as rule patterns are: a pattern with a control character (a
    // NUL) goes double-quoted with escapes, which single quotes cannot hold
    // (plan_fuzzer: yaml-cpp's single-quoted form did not parse back).
    std::vector<std::string> patterns;
    for (const auto& r : dp.ignore) patterns.push_back(plan_detail::quoted(r.pattern));
    items.push_back("ignore: [" + plan_detail::join(patterns, ", ") + "]");
  }
  if (dp.bucket_bytes != defaults.bucket_bytes) {
    YAML::Emitter e;
    e << dp.bucket_mb;
    items.push_back(std::string("bucket_mb: ") + e.c_str());
  }
  if (dp.first_bucket_bytes != defaults.first_bucket_bytes) {
    YAML::Emitter e;
    e << dp.first_bucket_mb;
    items.push_back(std::string("first_bucket_mb: ") + e.c_str());
  }
  if (dp.overlap != defaults.overlap) items.push_back(std::string("overlap: ") + (dp.overlap ? "true" : "false"));
  if (dp.zero != defaults.zero) items.push_back("zero: " + std::to_string(dp.zero));
  if (!dp.reduce_dtype.empty()) items.push_back("reduce_dtype: " + plan_detail::scalar(dp.reduce_dtype));
  y << "data_parallel: {" << plan_detail::join(items, ", ") << "}\n";
  return y.str();
}

}  // namespace detail

std::string Plan::batch_axis() const {
  if (!data_parallel.batch_axis.empty()) return data_parallel.batch_axis;
  for (const char* name : {"data", "batch"})
    for (const auto& a : mesh)
      if (a.name == name) return name;
  return "";
}

}  // namespace shardplan
