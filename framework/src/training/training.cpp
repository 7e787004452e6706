#include "shardplan/training.h"

namespace shardplan {

Training parallelize_for_training(torch::nn::Module& model, const Plan& plan, World& world) {
  Training t;
  t.report = parallelize(model, plan, world);
  t.data_parallel = std::make_unique<DataParallel>(model, t.report, plan, world);
  return t;
}

}  // namespace shardplan
