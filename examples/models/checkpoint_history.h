#pragma once
// --save DIR --keep K (train_loop.cpp): DIR holds the newest checkpoint and
// DIR.step-N beside it the K-1 before it, so a restart whose newest
// checkpoint is damaged goes on from an older one instead of failing the
// same way on every restart (docs/CHECKPOINTS.md, "Keeping several").
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace shardplan {
class World;
namespace examples {

// The checkpoints --resume auto would try, newest first: DIR when it is a
// non-empty directory, then every DIR.step-N directory, N descending.
// Torch-free and local (no world): what one rank sees.
std::vector<std::string> resume_candidates(const std::string& dir);

class CheckpointHistory {
 public:
  using Attributes = std::map<std::string, std::string>;
  CheckpointHistory(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  // Collective. Tries rank 0's resume_candidates in order with `load` (a
  // load_checkpoint, which changes nothing when it fails, and fails on every
  // rank alike); returns the first one's attributes and sets *from to it.
  // Each one skipped is printed by rank 0 on one line with its error. nullopt
  // when there is no checkpoint; throws when there are some but none loads.
  std::optional<Attributes> resume(World& world, const std::function<Attributes(const std::string&)>& load,
                                   std::string* from);

  // Collective. Keeps the checkpoint in DIR as DIR.step-N (hard links) when it
  // is older than `step` and was not skipped, saves with `write` (a
  // save_checkpoint to DIR, atomic), and only then removes what is beyond
  // the newest `keep`: kept copies past their number, skipped ones, and any
  // of `step` or later (a future the run abandoned by resuming earlier).
  void save(World& world, int step, const std::function<void(const std::string&)>& write);

 private:
  void keep_current(int step);  // rank 0
  void prune(int step);         // rank 0

  std::string dir_;
  int keep_;
  std::set<std::string> skipped_;  // by resume(): damaged, never kept
  std::optional<int> dir_step_;    // the step in DIR, when this run knows it
};

}  // namespace examples
}  // namespace shardplan
