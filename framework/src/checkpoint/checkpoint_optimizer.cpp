// Optimizer state in checkpoints: read out of and installed into SGD, Adam,
// AdamW, RMSprop and Adagrad (every optimizer ZeroOptimizer takes) per parameter, stored as items "optimizer/<param>/<field>" cut
// like the parameter. (ZeRO-1's slices: checkpoint_zero.cpp.)
#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/shape_text.h"
#include "checkpoint_internal.h"
#include "shardplan/checkpoint.h"
#include "shardplan/error.h"
#include "shardplan/zero_optimizer.h"
#include "shardplan/checkpoint_meta.h"

namespace shardplan::ckpt_detail {

namespace {

// Optimizer states are stored per parameter under "optimizer/<param>/<field>".
// libtorch keys them by the parameter's TensorImpl, as a string in 1.x and a
// pointer in 2.x: find the key type rather than naming it.
template <class Map>
typename Map::key_type state_key(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same<Key, std::string>::value) {
    std::ostringstream os;  // what c10::guts::to_string does
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

const char* optimizer_kind(torch::optim::Optimizer& opt) {
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return "sgd";
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<torch::optim::Adam*>(&opt)) return "adam";
  if (dynamic_cast<torch::optim::RMSprop*>(&opt)) return "rmsprop";
  if (dynamic_cast<torch::optim::Adagrad*>(&opt)) return "adagrad";
  throw Error("checkpoints save optimizer state for SGD, Adam, AdamW, RMSprop and Adagrad only");
}

std::vector<std::string> state_fields(const std::string& kind) {
  if (kind == "sgd") return {"momentum_buffer"};
  if (kind == "rmsprop") return {"square_avg", "momentum_buffer", "grad_avg"};
  if (kind == "adagrad") return {"sum"};
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

namespace {

std::unique_ptr<torch::optim::OptimizerParamState> empty_state(const std::string& kind) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGDParamState>();
  if (kind == "adam") return std::make_unique<torch::optim::AdamParamState>();
  if (kind == "adamw") return std::make_unique<torch::optim::AdamWParamState>();
  if (kind == "rmsprop") return std::make_unique<torch::optim::RMSpropParamState>();
  return std::make_unique<torch::optim::AdagradParamState>();
}

template <class T>
at::Tensor* field(const T& value) {
  return &const_cast<at::Tensor&>(value);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor*>> state_tensors(torch::optim::Optimizer& opt, const at::Tensor& p,
                                                               bool create, int64_t** step) {
  auto& states = opt.state();
  auto key = state_key(states, p);
  auto it = states.find(key);
  const std::string kind = optimizer_kind(opt);
  if (it == states.end()) {
    if (!create) return {};
    it = states.emplace(key, empty_state(kind)).first;
  }
  std::vector<at::Tensor*> t;  // in the order of state_fields(kind)
  *step = nullptr;
  auto* s = it->second.get();
  if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
    t = {field(g->momentum_buffer())};
  } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
    t = {field(a->exp_avg()), field(a->exp_avg_sq()), field(a->max_exp_avg_sq())};
    *step = &const_cast<int64_t&>(a->step());
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
    t = {field(w->exp_avg()), field(w->exp_avg_sq()), field(w->max_exp_avg_sq())};
    *step = &const_cast<int64_t&>(w->step());
  } else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(s)) {
    t = {field(r->square_avg()), field(r->momentum_buffer()), field(r->grad_avg())};
    *step = &const_cast<int64_t&>(r->step());
  } else if (auto* ag = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
    t = {field(ag->sum())};
    *step = &const_cast<int64_t&>(ag->step());
  }
  const std::vector<std::string> names = state_fields(kind);
  std::vector<std::pair<std::string, at::Tensor*>> out;
  for (size_t i = 0; i < t.size() && i < names.size(); ++i) out.emplace_back(names[i], t[i]);
  return out;
}

void clear_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& states = opt.state();
  states.erase(state_key(states, p));
}

// The optimizer of `options`, plain or ZeRO-1's inner one; null without.
torch::optim::Optimizer* optimizer_of(const CheckpointOptions& options) {
  if (options.optimizer && options.zero)
    throw Error("CheckpointOptions: set optimizer or zero, not both (zero's optimizer is its inner one)");
  return options.zero ? &options.zero->inner() : options.optimizer;
}

// States are matched to parameters by tensor: an optimizer over other
// tensors (a ZeroOptimizer's inner one, over its slices) would silently
// save and load nothing.
void check_optimizer_params(torch::optim::Optimizer& opt, const std::vector<Item>& items) {
  std::set<const void*> params;
  for (const auto& item : items)
    if (item.param.defined()) params.insert(item.param.unsafeGetTensorImpl());
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params())
      if (!params.count(p.unsafeGetTensorImpl()))
        throw Error("the optimizer has a tensor of shape " + shape_str(p.sizes()) +
                    " that is not a parameter of the model: build it over model.parameters() or "
                    "unique_parameters(model) (for a "
                    "ZeroOptimizer pass CheckpointOptions::zero, not its inner optimizer)");
}

// Appends the optimizer state of every parameter item as items
// "optimizer/<param>/<field>" cut like the parameter, and records the
// optimizer and the steps in `attributes`. ZeRO-1's slices are gathered
// first; only the batch-axis rank 0 gets them (the others would not write
// them: they are not split over the batch axis).
void add_optimizer_items(std::vector<Item>& items, const CheckpointOptions& options,
                         std::map<std::string, std::string>* attributes) {
  torch::optim::Optimizer* opt = optimizer_of(options);
  if (!opt) return;
  (*attributes)["optimizer"] = optimizer_kind(*opt);
  std::vector<ParamState> states;
  if (options.zero) {
    states = ckpt_detail::gather_zero_state(*options.zero);
  } else {
    check_optimizer_params(*opt, items);
    for (const auto& item : items) {
      if (!item.param.defined()) continue;
      ParamState st{item.param, item.name, {}, std::nullopt};
      int64_t* step = nullptr;
      for (auto& f : state_tensors(*opt, item.param, false, &step))
        if (f.second->defined()) st.fields.emplace_back(f.first, f.second->detach());
      if (step) st.step = *step;
      states.push_back(std::move(st));
    }
  }
  std::map<const void*, const ParamState*> by_param;
  for (const auto& st : states) by_param[st.param.unsafeGetTensorImpl()] = &st;
  const size_t n_items = items.size();
  for (size_t i = 0; i < n_items; ++i) {
    if (!items[i].param.defined()) continue;  // a buffer
    auto it = by_param.find(items[i].param.unsafeGetTensorImpl());
    if (it == by_param.end()) continue;
    for (const auto& f : it->second->fields) {
      Item s = items[i];
      s.name = "optimizer/" + items[i].name + "/" + f.first;
      s.local = f.second;
      s.param = at::Tensor();
      s.buffer = false;
      items.push_back(s);
    }
    if (it->second->step) (*attributes)["optimizer/" + items[i].name + "/step"] = std::to_string(*it->second->step);
  }
}

std::vector<ParamState> read_optimizer_states(torch::optim::Optimizer& optimizer, const CheckpointOptions& options,
                                              const ckpt::Meta& meta, const std::filesystem::path& target,
                                              const std::vector<Item>& items) {
  const auto it = meta.attributes.find("optimizer");
  const std::string kind = optimizer_kind(optimizer);
  if (it == meta.attributes.end())
    throw Error("the checkpoint has no optimizer state (saved without an optimizer)");
  if (it->second != kind)
    throw Error("the checkpoint's optimizer state is " + it->second + "'s, the optimizer given is " + kind);
  if (!options.zero) check_optimizer_params(optimizer, items);
  const std::vector<std::string> fields = state_fields(kind);
  std::vector<ParamState> out;
  for (const Item& item : items) {
    if (!item.param.defined()) continue;
    const std::string prefix = "optimizer/" + item.name + "/";
    ParamState load;
    load.param = item.param;
    load.name = item.name;
    for (const auto& f : fields) {
      const ckpt::TensorEntry* e = meta.find(prefix + f);
      if (!e) continue;
      if (e->shape != item.global_shape)
        throw Error("'" + e->name + "': the checkpoint's shape is " + shape_str(e->shape) + ", the model's " +
                    shape_str(item.global_shape));
      at::Tensor full = assemble(*e, target).to(item.local.scalar_type());
      load.fields.emplace_back(f, take_splits(full, item.splits).clone());
    }
    auto st = meta.attributes.find(prefix + "step");
    if (st != meta.attributes.end()) {
      try {
        load.step = std::stoll(st->second);
      } catch (const std::logic_error&) {
        throw Error("attribute '" + st->first + "' is not a step count: '" + st->second + "'");
      }
    }
    out.push_back(std::move(load));
  }
  return out;
}

void install_optimizer_states(torch::optim::Optimizer& optimizer, const std::vector<ParamState>& loads) {
  for (auto& load : loads) {
    if (load.fields.empty()) {
      clear_state(optimizer, load.param);  // as it was when saved: no state yet
      continue;
    }
    int64_t* step = nullptr;
    auto targets = state_tensors(optimizer, load.param, true, &step);
    for (auto& f : load.fields)
      for (auto& t : targets)
        if (t.first == f.first) *t.second = f.second;
    if (step && load.step) *step = *load.step;
  }
}

namespace {

const char* master_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

int64_t dtype_bytes(const std::string& name) {
  if (name == "float64") return 8;
  if (name == "float32") return 4;
  return 2;  // float16, bfloat16
}

}  // namespace

void use_masters(std::vector<Item>& items, const CheckpointOptions& options, const ckpt::Meta* loading) {
  const bool zero_masters = options.zero && options.zero->masters();
  if (options.masters.empty() && !zero_masters) return;
  std::map<const void*, at::Tensor> masters;  // model parameter -> master
  if (!options.masters.empty())
    for (const auto& [param, master] : options.masters) masters[param.unsafeGetTensorImpl()] = master;
  else if (!loading)
    for (const auto& [param, value] : options.zero->gather_masters()) masters[param.unsafeGetTensorImpl()] = value;
  else  // loaded into these, then cut into the slices (ZeroInstall)
    for (const auto& b : options.zero->layout())
      for (const auto& m : b.members)
        masters[m.first.unsafeGetTensorImpl()] = at::empty(m.first.sizes(), b.slice.options().requires_grad(false));
  for (Item& item : items) {
    if (!item.param.defined()) continue;
    const auto it = masters.find(item.param.unsafeGetTensorImpl());
    if (it == masters.end()) continue;
    const at::Tensor& master = it->second;
    if (loading)
      if (const ckpt::TensorEntry* e = loading->find(item.name);
          e && dtype_bytes(e->dtype) < static_cast<int64_t>(master.element_size()))
        throw Error("'" + item.name + "' is " + e->dtype + " in the checkpoint but the optimizer keeps " +
                    master_dtype_name(master.scalar_type()) +
                    " master weights: it was saved without them; load it without MixedPrecision::master_dtype "
                    "(or save it from a model with masters)");
    item.model = item.local;
    item.local = master.detach();
    if (!options.zero) item.param = master;
  }
}

}  // namespace shardplan::ckpt_detail
