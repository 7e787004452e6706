#pragma once
// Operations that do not run inline: the per-communicator worker that runs
// them in issue order, and waiting for them (wait_all inlines into the ABI's
// wait and the blocking path of issue, as it did in one file).
#include <memory>

#include "group.h"

namespace sp_local {

// True once `op` itself finished; false when user_deadline came first. A
// posted receive is failed here when its own deadline passes.
bool wait_done(Op* op, Clock::time_point user_deadline);

// Complete in the ABI's sense: this operation and every receive issued before it.
inline bool wait_all(Op* op, Clock::time_point user_deadline) {
  for (auto& dep : op->deps)
    if (!wait_done(dep.get(), user_deadline)) return false;
  return wait_done(op, user_deadline);
}

void execute(Comm* c, const std::shared_ptr<Op>& op);
void enqueue(Comm* c, std::shared_ptr<Op> op);
std::shared_ptr<Op> make_op(Comm* c, const Desc& d);

}  // namespace sp_local
