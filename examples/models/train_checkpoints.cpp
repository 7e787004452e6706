// --save, --load and --resume auto for one rank (models/train_rank.h).
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "models/train_rank.h"
#include "shardplan/checkpoint.h"
#include "shardplan/pipeline_checkpoint.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

TrainCheckpoints::TrainCheckpoints(TrainRank& r, Optimizer& opt, Schedule& schedule)
    : r_(r), opt_(opt), schedule_(schedule), history_(r.a.save, r.a.keep) {}

TrainCheckpoints::TrainCheckpoints(TrainRank& r, const Pipeline& pipe, Optimizer& opt, Schedule& schedule)
    : r_(r), opt_(opt), pipe_(&pipe), schedule_(schedule), history_(r.a.save, r.a.keep) {}

CheckpointOptions TrainCheckpoints::options() const { return opt_.checkpoint_options(); }

// A pipelined run's rank saves and loads its stage's tensors only.
std::map<std::string, std::string> TrainCheckpoints::load(const std::string& dir) {
  if (pipe_) return load_checkpoint(dir, *pipe_, *r_.m.module, r_.report, r_.world, options());
  return load_checkpoint(dir, *r_.m.module, r_.report, r_.world, options());
}

void TrainCheckpoints::save(const std::string& dir, const CheckpointOptions& o) {
  if (pipe_) return save_checkpoint(dir, *pipe_, *r_.m.module, r_.report, r_.world, o);
  save_checkpoint(dir, *r_.m.module, r_.report, r_.world, o);
}

int TrainCheckpoints::resume(at::Generator& gen) {
  const Args& a = r_.a;
  auto load = [&](const std::string& dir) { return this->load(dir); };
  std::string from = a.load;
  std::optional<CheckpointHistory::Attributes> attributes;
  if (a.resume_auto)
    attributes = history_.resume(r_.world, load, &from);
  else if (!a.load.empty())
    attributes = load(a.load);
  if (!attributes) return 1;
  const auto it = attributes->find("step");
  if (it == attributes->end()) throw Error("checkpoint '" + from + "' records no step");
  const int start = std::stoi(it->second) + 1;
  opt_.load_attributes(*attributes);  // the loss scaler's state
  if (start <= a.steps) schedule_.resume(*attributes, a.override_schedule, from);  // else no lr is used
  for (int s = 1; s < start; ++s) r_.m.model->sample(gen, a.batch, r_.corpus);
  if (r_.lead()) std::printf("resumed from %s at step %d\n", from.c_str(), start - 1);
  return start;
}

void TrainCheckpoints::maybe_save(int step) {
  const Args& a = r_.a;
  if (a.save.empty() || !(step == a.steps || (a.save_every > 0 && step % a.save_every == 0))) return;
  // Added to the optimizer's own attributes (a loss scaler's state).
  CheckpointOptions o = options();
  o.attributes["step"] = std::to_string(step);
  o.attributes["model"] = a.model;
  o.attributes["config"] = r_.m.model->config_str();
  schedule_.save(o.attributes);
  history_.save(r_.world, step, [&](const std::string& dir) { save(dir, o); });
  if (r_.lead()) std::printf("saved %s at step %d\n", a.save.c_str(), step);
}

}  // namespace examples
}  // namespace shardplan
