// ZeRO-1's optimizer state in checkpoints (docs/CHECKPOINTS.md): stored as
// the per-parameter tensors a plain optimizer would hold, so a checkpoint
// does not depend on the bucket plan or the batch-axis size it was saved at.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
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

namespace {

// Per member of bucket `b`: [has state, step, field 0 defined, ...], from the
// segments this rank holds, the maximum over the batch axis (-1: no rank
// holds any of it). A parameter's segments are stepped together on every
// rank, so those that hold one agree.
at::Tensor state_info(ZeroOptimizer& zero, const ZeroOptimizer::Bucket& b, const std::vector<std::string>& names) {
  torch::optim::Optimizer& opt = zero.inner();
  const int64_t width = 2 + static_cast<int64_t>(names.size());
  at::Tensor info = at::full({static_cast<int64_t>(b.members.size()), width}, -1, at::kLong);
  auto row = info.accessor<int64_t, 2>();
  for (const auto& seg : b.segments) {
    int64_t* step = nullptr;
    const auto fields = state_tensors(opt, seg.tensor, false, &step);
    const auto m = static_cast<int64_t>(seg.member);
    row[m][0] = fields.empty() ? 0 : 1;
    row[m][1] = step ? *step : 0;
    for (size_t f = 0; f < names.size(); ++f)
      row[m][2 + f] = f < fields.size() && fields[f].second->defined() ? 1 : 0;
  }
  DataParallel& dp = zero.data_parallel();
  if (!dp.group() || dp.size() == 1) return info;
  at::Tensor on_device = info.to(b.slice.device());  // a GPU backend reduces device memory only
  dp.group()->all_reduce(on_device, ReduceOp::Max);
  return on_device.cpu();
}

}  // namespace

std::vector<ParamState> gather_zero_state(ZeroOptimizer& zero) {
  DataParallel& dp = zero.data_parallel();
  Communicator* group = dp.group();
  torch::optim::Optimizer& opt = zero.inner();
  const std::string kind = optimizer_kind(opt);
  const std::vector<std::string> names = state_fields(kind);
  std::vector<ParamState> out;
  for (const auto& b : zero.layout()) {
    const at::Tensor info = state_info(zero, b, names);
    auto row = info.accessor<int64_t, 2>();
    // Every field some parameter of the bucket has, whole on batch-axis rank 0.
    std::vector<std::pair<std::string, at::Tensor>> whole;  // [padded]
    for (size_t f = 0; f < names.size(); ++f) {
      bool any = false;
      for (int64_t m = 0; m < info.size(0); ++m) any = any || row[m][2 + f] == 1;
      if (!any) continue;
      at::Tensor mine = at::zeros_like(b.slice);
      for (const auto& seg : b.segments) {
        int64_t* step = nullptr;
        const auto fields = state_tensors(opt, seg.tensor, false, &step);
        if (f < fields.size() && fields[f].second->defined())
          mine.narrow(0, seg.begin, seg.tensor.numel()).copy_(fields[f].second->reshape(-1));
      }
      at::Tensor all = group && dp.size() > 1 ? group->gather(mine, 0) : mine;
      if (dp.rank() == 0) whole.emplace_back(names[f], all);
    }
    if (dp.rank() != 0) continue;
    for (size_t m = 0; m < b.members.size(); ++m) {
      const auto& [param, offset] = b.members[m];
      ParamState st{param, "", {}, std::nullopt};
      if (row[m][0] == 1) {
        for (const auto& [field, flat] : whole) {
          const size_t f = std::find(names.begin(), names.end(), field) - names.begin();
          if (row[m][2 + f] == 1)
            st.fields.emplace_back(field, flat.narrow(0, offset, param.numel()).view(param.sizes()).clone());
        }
        if (kind != "sgd") st.step = row[m][1];
      }
      out.push_back(std::move(st));
    }
  }
  // Outside the buckets: whole on this rank, as a plain optimizer holds them.
  for (const at::Tensor& p : zero.locals()) {
    ParamState st{p, "", {}, std::nullopt};
    int64_t* step = nullptr;
    for (auto& f : state_tensors(opt, p, false, &step))
      if (f.second->defined()) st.fields.emplace_back(f.first, f.second->detach().clone());
    if (step && !st.fields.empty() && kind != "sgd") st.step = *step;
    out.push_back(std::move(st));
  }
  return out;
}

ZeroInstall::ZeroInstall(ZeroOptimizer& zero, const std::vector<ParamState>& states,
                         std::map<const void*, at::Tensor> values)
    : zero_(zero), values_(std::move(values)) {
  std::map<const void*, const ParamState*> by_param;
  for (const auto& s : states) by_param[s.param.unsafeGetTensorImpl()] = &s;
  for (const at::Tensor& p : zero.locals()) {
    const auto it = by_param.find(p.unsafeGetTensorImpl());
    locals_.push_back(it != by_param.end() ? *it->second : ParamState{p, "", {}, std::nullopt});
  }
  DataParallel& dp = zero.data_parallel();
  for (const auto& b : zero.layout()) {
    // Each parameter's state placed whole in the bucket, then cut into this
    // rank's segments: every parameter keeps its own step.
    std::vector<const ParamState*> member(b.members.size(), nullptr);
    std::vector<std::pair<std::string, at::Tensor>> whole;
    for (size_t m = 0; m < b.members.size(); ++m) {
      const auto& [param, offset] = b.members[m];
      auto it = by_param.find(param.unsafeGetTensorImpl());
      if (it == by_param.end() || it->second->fields.empty()) continue;  // never stepped: no state
      member[m] = it->second;
      for (const auto& [field, value] : it->second->fields) {
        size_t k = 0;
        while (k < whole.size() && whole[k].first != field) ++k;
        if (k == whole.size()) whole.emplace_back(field, at::zeros({b.padded}, b.slice.options().requires_grad(false)));
        whole[k].second.narrow(0, offset, param.numel()).copy_(value.reshape(-1));
      }
    }
    const int64_t lo = dp.rank() * (b.padded / dp.size());
    std::vector<Slice> segments;
    for (const auto& seg : b.segments) {
      Slice s;
      if (const ParamState* st = member[seg.member]) {
        for (const auto& [field, value] : st->fields)
          for (const auto& [name, flat] : whole)
            if (name == field) s.fields.emplace_back(field, flat.narrow(0, lo + seg.begin, seg.tensor.numel()).clone());
        s.step = st->step;
      }
      segments.push_back(std::move(s));
    }
    slices_.push_back(std::move(segments));
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
    for (const auto& [param, offset] : b.members) {
      const auto v = values_.find(param.unsafeGetTensorImpl());
      flat.narrow(0, offset, param.numel()).copy_((v == values_.end() ? param : v->second).reshape(-1));
    }
    const int64_t n = b.padded / dp.size();
    b.slice.detach().copy_(flat.narrow(0, dp.rank() * n, n));
    for (size_t k = 0; k < b.segments.size(); ++k) {
      const at::Tensor& p = b.segments[k].tensor;
      const Slice& s = slices_[i][k];
      if (s.fields.empty()) {
        clear_state(opt, p);
        continue;
      }
      int64_t* step = nullptr;
      auto targets = state_tensors(opt, p, true, &step);
      for (const auto& f : s.fields)
        for (auto& t : targets)
          if (t.first == f.first) *t.second = f.second;
      if (step && s.step) *step = *s.step;
    }
  }
  install_optimizer_states(opt, locals_);
}

}  // namespace shardplan::ckpt_detail
