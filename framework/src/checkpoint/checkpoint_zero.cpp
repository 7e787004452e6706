// ZeRO-1's optimizer state in checkpoints (docs/CHECKPOINTS.md): stored as
// the per-parameter tensors a plain optimizer would hold, so a checkpoint
// does not depend on the bucket plan or the batch-axis size it was saved at.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_internal.h"
#include "shardplan/communicator.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/zero_optimizer.h"

namespace shardplan::ckpt_detail {

std::vector<ParamState> gather_zero_state(ZeroOptimizer& zero) {
  DataParallel& dp = zero.data_parallel();
  Communicator* group = dp.group();
  torch::optim::Optimizer& opt = zero.inner();
  std::vector<ParamState> out;
  for (const auto& b : zero.layout()) {
    // Every rank of the batch axis steps every bucket together, so they agree
    // on which fields exist and on the step.
    int64_t* step = nullptr;
    std::vector<std::pair<std::string, at::Tensor>> whole;  // [padded], on batch-axis rank 0
    for (auto& f : state_tensors(opt, b.slice, false, &step)) {
      if (!f.second->defined()) continue;
      at::Tensor all = group && dp.size() > 1 ? group->gather(f.second->contiguous(), 0) : *f.second;
      if (dp.rank() == 0) whole.emplace_back(f.first, all);
    }
    if (dp.rank() != 0) continue;
    for (const auto& [param, offset] : b.members) {
      ParamState st{param, "", {}, std::nullopt};
      for (const auto& [field, flat] : whole)
        st.fields.emplace_back(field, flat.narrow(0, offset, param.numel()).view(param.sizes()).clone());
      if (step && !whole.empty()) st.step = *step;
      out.push_back(std::move(st));
    }
  }
  return out;
}

ZeroInstall::ZeroInstall(ZeroOptimizer& zero, const std::vector<ParamState>& states) : zero_(zero) {
  std::map<const void*, const ParamState*> by_param;
  for (const auto& s : states) by_param[s.param.unsafeGetTensorImpl()] = &s;
  DataParallel& dp = zero.data_parallel();
  for (const auto& b : zero.layout()) {
    Slice slice;
    std::string step_from;  // the parameter the bucket's step came from
    std::vector<std::pair<std::string, at::Tensor>> whole;
    for (const auto& [param, offset] : b.members) {
      auto it = by_param.find(param.unsafeGetTensorImpl());
      if (it == by_param.end() || it->second->fields.empty()) continue;  // zeros: never stepped
      const ParamState& st = *it->second;
      if (st.step) {
        if (slice.step && *slice.step != *st.step)
          throw Error("ZeRO-1 steps the parameters of one bucket together, but the checkpoint's '" + st.name +
                      "' was stepped " + std::to_string(*st.step) + " times and '" + step_from + "' " +
                      std::to_string(*slice.step));
        slice.step = st.step;
        step_from = st.name;
      }
      for (const auto& [field, value] : st.fields) {
        size_t k = 0;
        while (k < whole.size() && whole[k].first != field) ++k;
        if (k == whole.size()) whole.emplace_back(field, at::zeros({b.padded}, b.slice.options().requires_grad(false)));
        whole[k].second.narrow(0, offset, param.numel()).copy_(value.reshape(-1));
      }
    }
    const int64_t n = b.padded / dp.size();
    for (auto& [field, flat] : whole) slice.fields.emplace_back(field, flat.narrow(0, dp.rank() * n, n).clone());
    slices_.push_back(std::move(slice));
  }
}

void ZeroInstall::apply() {
  at::NoGradGuard no_grad;
  DataParallel& dp = zero_.data_parallel();
  torch::optim::Optimizer& opt = zero_.inner();
  const auto layout = zero_.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& b = layout[i];
    // The slice's values are the optimizer's copy of the parameters: the
    // model's just-loaded ones.
    at::Tensor flat = at::zeros({b.padded}, b.slice.options().requires_grad(false));
    for (const auto& [param, offset] : b.members) flat.narrow(0, offset, param.numel()).copy_(param.reshape(-1));
    const int64_t n = b.padded / dp.size();
    b.slice.detach().copy_(flat.narrow(0, dp.rank() * n, n));
    const Slice& s = slices_[i];
    if (s.fields.empty()) {
      clear_state(opt, b.slice);
      continue;
    }
    int64_t* step = nullptr;
    auto targets = state_tensors(opt, b.slice, true, &step);
    for (const auto& f : s.fields)
      for (auto& t : targets)
        if (t.first == f.first) *t.second = f.second;
    if (step && s.step) *step = *s.step;
  }
}

}  // namespace shardplan::ckpt_detail
