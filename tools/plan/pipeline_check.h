#pragma once
// `shardplan plan check --model` for a plan with a `pipeline:` key: the
// stages the model's pieces make, their parameter bytes and the schedule's
// predicted bubble, as notes; stages that do not fit the model as errors.
#include <torch/nn/module.h>

#include "shardplan/plan.h"
#include "shardplan/plan_check.h"

namespace shardplan_plan {

void check_pipeline(torch::nn::Module& model, const shardplan::Plan& plan, shardplan::PlanCheck& result);

}  // namespace shardplan_plan
