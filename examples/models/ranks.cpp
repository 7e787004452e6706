#include "models/ranks.h"

#include "shardplan/world.h"

namespace shardplan {
namespace examples {

void run_ranks(int thread_ranks, const std::function<void(World&, int ranks_in_process)>& fn) {
  if (WorldOptions::env_has_job()) {
    auto world = init_world(WorldOptions::from_env());
    fn(*world, 1);
  } else {
    run_ranks_in_threads(thread_ranks, [&](World& w) { fn(w, thread_ranks); });
  }
}

Placement placement_of(int thread_ranks) {
  if (!WorldOptions::env_has_job()) return {thread_ranks, true};
  const WorldOptions o = WorldOptions::from_env();
  return {o.world_size, o.rank == 0};
}

}  // namespace examples
}  // namespace shardplan
