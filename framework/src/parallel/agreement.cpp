#include "shardplan/agreement.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "shardplan/abi/comm.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"
#include "base/shape_text.h"

namespace shardplan {

namespace {

std::string digest_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

std::string param_str(const AgreementDigest::Param& p) {
  return "'" + p.path + "' " + shape_str(p.shape) + " " + p.dtype;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b);
}

// The compared parts only: the plan's source path may differ between nodes.
std::string compared_text(const AgreementDigest& d) {
  std::string out;
  for (const auto& l : d.plan_lines) out += "Y\t" + l + "\n";
  for (const auto& p : d.params) {
    out += "M\t" + p.path + "\t";
    for (size_t i = 0; i < p.shape.size(); ++i) out += (i ? "," : "") + std::to_string(p.shape[i]);
    out += "\t" + p.dtype + "\n";
  }
  return out;
}

bool same(const AgreementDigest::Param& a, const AgreementDigest::Param& b) {
  return a.path == b.path && a.shape == b.shape && a.dtype == b.dtype;
}

const char* const kRuleStart = "  - match:";

std::string plan_difference(const AgreementDigest& mine, const AgreementDigest& ref, int r) {
  const auto& a = mine.plan_lines;
  const auto& b = ref.plan_lines;
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  if (i == a.size() && i == b.size()) return "";
  int rule = 0;
  std::string rule_match;  // rank 0's pattern line of that rule, when it has it
  for (size_t k = 0; k <= i; ++k) {
    const bool starts_a = k < a.size() && a[k].rfind(kRuleStart, 0) == 0;
    const bool starts_b = k < b.size() && b[k].rfind(kRuleStart, 0) == 0;
    if (starts_a || starts_b) {
      ++rule;
      rule_match = trim((starts_b ? b[k] : a[k]).substr(std::strlen(kRuleStart)));
    }
  }
  // Rule lines quote their patterns in single quotes, so lines go in double ones.
  auto line = [&](const std::vector<std::string>& v) {
    if (i >= v.size()) return std::string("nothing more");
    std::string l = trim(v[i]);
    if (l.rfind("- ", 0) == 0) l = l.substr(2);
    return "\"" + l + "\"";
  };
  const std::string rr = "rank " + std::to_string(r);
  return rr + " runs a different plan than rank 0: " +
         (rule > 0 ? "rule " + std::to_string(rule) + " (match: " + rule_match + ") differs: " : std::string()) + rr +
         "'s plan (" + mine.plan_source + ") has " + line(a) + " where rank 0's (" + ref.plan_source + ") has " +
         line(b);
}

std::string model_difference(const AgreementDigest& mine, const AgreementDigest& ref, int r) {
  const auto& a = mine.params;
  const auto& b = ref.params;
  size_t i = 0;
  while (i < a.size() && i < b.size() && same(a[i], b[i])) ++i;
  if (i == a.size() && i == b.size()) return "";
  const std::string rr = "rank " + std::to_string(r);
  std::string what;
  if (i == b.size()) {
    what = rr + "'s model has " + std::to_string(a.size()) + " parameters where rank 0's has " +
           std::to_string(b.size()) + ": rank 0 has no parameter " + param_str(a[i]);
  } else if (i == a.size()) {
    what = rr + "'s model has " + std::to_string(a.size()) + " parameters where rank 0's has " +
           std::to_string(b.size()) + ": " + rr + " has no parameter " + param_str(b[i]);
  } else if (a[i].path == b[i].path) {
    what = rr + "'s model has parameter '" + a[i].path + "' " + shape_str(a[i].shape) + " " + a[i].dtype +
           " where rank 0 has " + shape_str(b[i].shape) + " " + b[i].dtype;
  } else {
    what = rr + "'s model has parameter " + param_str(a[i]) + " where rank 0 has " + param_str(b[i]) +
           " (parameter #" + std::to_string(i + 1) + " in named_parameters() order)";
  }
  return what;
}

}  // namespace

AgreementDigest AgreementDigest::of(torch::nn::Module& model, const Plan& plan) {
  AgreementDigest d;
  d.plan_source = plan.source;
  for (auto& l : split_lines(plan.to_yaml()))
    if (l.rfind("plugins:", 0) != 0) d.plan_lines.push_back(std::move(l));
  for (const auto& p : model.named_parameters(/*recurse=*/true))
    d.params.push_back({p.key(), p.value().sizes().vec(), digest_dtype_name(p.value().scalar_type())});
  return d;
}

uint64_t AgreementDigest::hash() const {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : compared_text(*this)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string AgreementDigest::serialize() const { return "S\t" + plan_source + "\n" + compared_text(*this); }

AgreementDigest AgreementDigest::parse(const std::string& text) {
  AgreementDigest d;
  for (const auto& line : split_lines(text)) {
    if (line.size() < 2 || line[1] != '\t') continue;
    const std::string rest = line.substr(2);
    if (line[0] == 'S') {
      d.plan_source = rest;
    } else if (line[0] == 'Y') {
      d.plan_lines.push_back(rest);
    } else if (line[0] == 'M') {
      const auto t1 = rest.find('\t');
      const auto t2 = rest.rfind('\t');
      if (t1 == std::string::npos || t2 == t1) continue;
      Param p;
      p.path = rest.substr(0, t1);
      std::stringstream dims(rest.substr(t1 + 1, t2 - t1 - 1));
      std::string dim;
      while (std::getline(dims, dim, ','))
        if (!dim.empty()) p.shape.push_back(std::stoll(dim));
      p.dtype = rest.substr(t2 + 1);
      d.params.push_back(std::move(p));
    }
  }
  return d;
}

std::string first_disagreement(const std::vector<AgreementDigest>& digests) {
  for (size_t r = 1; r < digests.size(); ++r) {
    // The plan first: a different plan often comes with a different model config.
    std::string why = plan_difference(digests[r], digests[0], static_cast<int>(r));
    if (why.empty()) why = model_difference(digests[r], digests[0], static_cast<int>(r));
    if (!why.empty()) return why;
  }
  return "";
}

void check_ranks_agree(torch::nn::Module& model, const Plan& plan, Communicator& comm) {
  if (comm.size() == 1) return;
  // A device-only backend (nccl) exchanges the digests in the model's device memory.
  at::Device device(at::kCPU);
  if (!(comm.api()->caps & SP_CAP_CPU)) {
    for (const auto& p : model.parameters())
      if (p.is_cuda()) {
        device = p.device();
        break;
      }
    if (device.is_cpu()) return;  // nothing this backend can move; the plan's groups would fail anyway
  }
  auto gather = [&](const at::Tensor& t) { return comm.all_gather(t.to(device), 0).cpu(); };
  const AgreementDigest mine = AgreementDigest::of(model, plan);
  at::Tensor h = at::empty({1}, at::kLong);
  h.data_ptr<int64_t>()[0] = static_cast<int64_t>(mine.hash());
  const at::Tensor hashes = gather(h);
  const int64_t* hp = hashes.data_ptr<int64_t>();
  if (std::all_of(hp, hp + comm.size(), [&](int64_t x) { return x == hp[0]; })) return;

  // Every rank saw the same hashes, so every rank takes this path and the
  // exchange below pairs up; it runs only when something is already wrong.
  const std::string text = mine.serialize();
  const at::Tensor lens = gather(at::full({1}, static_cast<int64_t>(text.size()), at::kLong));
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t width = std::max<int64_t>(1, *std::max_element(lp, lp + comm.size()));
  at::Tensor buf = at::zeros({width}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), text.data(), text.size());
  const at::Tensor all = gather(buf);
  std::vector<AgreementDigest> digests;
  for (int r = 0; r < comm.size(); ++r)
    digests.push_back(AgreementDigest::parse(
        std::string(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * width, static_cast<size_t>(lp[r]))));
  std::string why = first_disagreement(digests);
  if (why.empty()) why = "the ranks' plan and model digests differ";
  // Group ranks are world ranks only for the world group; say which.
  if (comm.name() != "world") why += " (ranks of group '" + comm.name() + "')";
  throw Error("parallelize: " + why + "; every rank must apply the same plan to the same model");
}

}  // namespace shardplan
