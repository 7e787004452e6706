#pragma once
// What one training step of a sharded model hands to collectives, measured
// rather than derived: the model is sharded on every rank of a world of
// threads (local backend) and one forward + backward is run. A formula would
// have to know every plugin's strategy; running them counts what they do,
// including what a plugin does for options no formula anticipated. The plan
// checker (shardplan/plan_check.h) reports it as its communication
// prediction.
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/plan.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

// One replica per rank (replicas.size() is the world size), identically
// built. Each is sharded by `plan` on its rank; then loss(replica) is
// computed and backpropagated once. Returns, per rank, the calls and bytes
// handed to collectives during that forward + backward (not while applying
// the plan). A plan with a batch axis also averages the gradients over it
// (DataParallel::finish, counted), and `data_parallel`, when given, receives
// rank 0's bucket plan with that traffic next to its theoretical minimum
// (DataParallel::describe). Every rank runs `loss` on the batch it is
// given: the model-axis bytes are those of that batch. The replicas are
// left sharded. Throws what parallelize or the step throws, naming the rank.
std::vector<CommStats> measure_step_comm(const Plan& plan,
                                         const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                                         const std::function<at::Tensor(torch::nn::Module&)>& loss,
                                         std::string* data_parallel = nullptr);

}  // namespace shardplan
