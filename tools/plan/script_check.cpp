// `plan check --script`: what the checker can say of a TorchScript module is
// what sharding it says (the rewrite's errors) and, with a probe, what
// running it says; nothing is static about a traced module's shapes.
#include "script_check.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>

#include "shardplan/error.h"
#include "shardplan/count_option.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace shardplan_plan {

namespace {

bool parse_dims(const std::string& s, std::vector<int64_t>& dims) {
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, 'x')) {
    const auto d = shardplan::whole_number(part, 0, 999999999);
    if (!d) return false;
    dims.push_back(*d);
  }
  return !dims.empty();
}

void append_tensors(const c10::IValue& v, const std::string& spec, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple() || v.isList()) {
    for (const auto& item : v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec())
      append_tensors(item, spec, out);
  } else {
    throw shardplan::Error("--probe " + spec + ": the file holds a " + v.tagKind() +
                           ", not a tensor or a tuple or list of tensors");
  }
}

std::vector<at::Tensor> read_probes(const std::vector<std::string>& specs) {
  torch::manual_seed(0);
  std::vector<at::Tensor> out;
  for (const auto& spec : specs) {
    const size_t colon = spec.find(':');
    std::vector<int64_t> dims, high;
    if (parse_dims(spec.substr(0, colon), dims)) {
      if (colon == std::string::npos) {
        out.push_back(torch::randn(dims, torch::kDouble));
        continue;
      }
      if (parse_dims(spec.substr(colon + 1), high) && high.size() == 1 && high[0] > 0) {
        out.push_back(torch::randint(high[0], dims, torch::kLong));
        continue;
      }
      throw shardplan::Error("--probe " + spec + ": after the shape, ':' takes the integers' bound (2x6:48)");
    }
    std::ifstream in(spec, std::ios::binary);
    if (!in) throw shardplan::Error("--probe " + spec + ": neither a shape (2x6, 2x6:48) nor a readable file");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      append_tensors(torch::pickle_load(bytes), spec, out);
    } catch (const shardplan::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw shardplan::Error("--probe " + spec + ": not a file written by torch.save: " + e.what());
    }
  }
  return out;
}

// Without a probe nothing runs: the rewrite's refusals are all there is.
std::vector<shardplan::ParallelReport> shard_only(const torch::jit::Module& m, const shardplan::Plan& plan,
                                                  int world_size) {
  std::vector<shardplan::ParallelReport> reports(world_size);
  std::mutex mu;
  shardplan::run_ranks_in_threads(world_size, [&](shardplan::World& world) {
    auto sp = shardplan::parallelize_script(m, plan, world);
    std::lock_guard<std::mutex> lock(mu);
    reports[world.rank()] = sp.report;
  });
  return reports;
}

void lines_into(const std::string& text, std::vector<std::string>& out) {
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
}

}  // namespace

shardplan::PlanCheck check_script(const std::string& file, const shardplan::Plan& plan, int world_size,
                                  const std::vector<std::string>& probes) {
  shardplan::PlanCheck r;
  r.plan_file = plan.source;
  r.world_size = world_size;
  r.subject = "TorchScript module " + file;
  torch::jit::Module m = shardplan::load_script_module(file);
  const auto probe = read_probes(probes);
  std::vector<shardplan::ParallelReport> reports;
  try {
    if (probe.empty()) {
      reports = shard_only(m, plan, world_size);
      r.notes.push_back("not run: give --probe to verify the sharded module against the unsharded one");
    } else {
      const auto v = shardplan::verify_script(m, plan, world_size, probe);
      reports = v.reports;
      lines_into("verify: " + v.str(), v.passed() ? r.notes : r.errors);
    }
  } catch (const std::exception& e) {
    r.errors.push_back(e.what());
  }
  if (!reports.empty() && !reports.front().rows.empty()) {
    r.report = reports.front();
    for (const auto& rep : reports) r.rank_bytes.push_back(rep.local_bytes());
  }
  return r;
}

}  // namespace shardplan_plan
