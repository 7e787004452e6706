#pragma once
// Before sharding, the ranks check that they run the same plan on the same
// model. Ranks that disagree (another plan file, another model config on one
// node) would otherwise cut incompatible shards and fail much later with a
// shape error inside a collective, or silently train the wrong thing.
#include <cstdint>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class Communicator;
class Plan;

// What the ranks compare: the plan's canonical YAML (without its `plugins:`
// directories, which may differ from node to node) and every parameter's
// path, global shape and dtype in named_parameters() order.
struct AgreementDigest {
  std::string plan_source;             // where this rank's plan came from, for messages
  std::vector<std::string> plan_lines;
  struct Param {
    std::string path;
    std::vector<int64_t> shape;
    std::string dtype;
  };
  std::vector<Param> params;

  static AgreementDigest of(torch::nn::Module& model, const Plan& plan);
  uint64_t hash() const;  // FNV-1a over the compared parts; equal digests hash alike
  std::string serialize() const;
  static AgreementDigest parse(const std::string& text);
};

// The first difference between `digests[r]` and `digests[0]` for the lowest
// rank r that differs, as one line ("rank 1's model has parameter
// 'fc2.weight' [32, 64] float32 where rank 0 has [32, 48] float32"), or ""
// when all agree.
std::string first_disagreement(const std::vector<AgreementDigest>& digests);

// Collective over `comm`: one all-gather of a 64-bit hash when the ranks
// agree (nothing at all in a group of one); otherwise the digests are
// exchanged and every rank throws the same shardplan::Error naming the first
// difference. parallelize() calls it before touching the model.
void check_ranks_agree(torch::nn::Module& model, const Plan& plan, Communicator& comm);

}  // namespace shardplan
