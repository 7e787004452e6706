#include "shardplan/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"
#include "checkpoint_internal.h"

namespace shardplan {

using ckpt_detail::assemble;
using ckpt_detail::optimizer_kind;
using ckpt_detail::ParamState;
using ckpt_detail::state_tensors;
using ckpt_detail::rank_file;
using ckpt_detail::read_meta;
using ckpt_detail::take_splits;
using ckpt_detail::writes_piece;

namespace fs = std::filesystem;

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::map<std::string, const ReportRow*> rows_by_path(const ParallelReport& report) {
  std::map<std::string, const ReportRow*> rows;
  for (const auto& row : report.rows)
    if (!row.global_shape.empty() || row.module_type.empty() || !row.path.empty()) rows.emplace(row.path, &row);
  return rows;
}

// Inverse of take_split over one axis group: every member's piece, padded to
// the largest chunk for the all-gather, trimmed and put back block by block.
at::Tensor gather_split(const at::Tensor& local, const ShardSplit& s, int64_t global_dim_size, Communicator& group) {
  if (s.parts == 1) return local;
  const int64_t block = global_dim_size / s.blocks;
  const int64_t chunk = (block + s.parts - 1) / s.parts;
  std::vector<int64_t> sizes = local.sizes().vec();
  // [.., blocks * len, ..] -> [.., blocks, len, ..]
  std::vector<int64_t> blocked(sizes.begin(), sizes.begin() + s.dim);
  blocked.push_back(s.blocks);
  blocked.push_back(sizes[s.dim] / s.blocks);
  blocked.insert(blocked.end(), sizes.begin() + s.dim + 1, sizes.end());
  at::Tensor piece = local.contiguous().view(blocked);
  const int64_t len = blocked[s.dim + 1];
  if (len < chunk) {
    std::vector<int64_t> pad_shape = blocked;
    pad_shape[s.dim + 1] = chunk - len;
    piece = at::cat({piece, at::zeros(pad_shape, piece.options())}, s.dim + 1);
  }
  at::Tensor all = group.all_gather(piece.unsqueeze(0).contiguous(), 0);  // [parts, .., blocks, chunk, ..]
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < s.parts; ++r) {
    const auto range = shard_range(block, s.parts, r);
    parts.push_back(all[r].narrow(s.dim + 1, 0, range.second - range.first));
  }
  at::Tensor joined = at::cat(parts, s.dim + 1);  // [.., blocks, block, ..]
  std::vector<int64_t> out = sizes;
  out[s.dim] = global_dim_size;
  return joined.reshape(out);
}


std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: throw Error(std::string("checkpoints do not support dtype ") + c10::toString(t));
  }
}


// ------------------------------------------------------------ tensor inventory

// Everything a checkpoint holds for one tensor of this rank.
struct Item {
  std::string name;
  at::Tensor local;                  // this rank's piece, as the model holds it (detached)
  at::Tensor param;                  // the parameter itself: optimizer states are keyed by it
  std::vector<int64_t> global_shape;
  std::vector<ShardSplit> splits;    // how `local` was cut; empty: whole
  std::string layout;
  bool buffer = false;
};

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

namespace ckpt_detail {

const char* optimizer_kind(torch::optim::Optimizer& opt) {
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return "sgd";
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<torch::optim::Adam*>(&opt)) return "adam";
  throw Error("checkpoints save optimizer state for SGD, Adam and AdamW only");
}

std::vector<std::pair<std::string, at::Tensor*>> state_tensors(torch::optim::Optimizer& opt, const at::Tensor& p,
                                                               bool create, int64_t** step) {
  auto& states = opt.state();
  auto key = state_key(states, p);
  auto it = states.find(key);
  const std::string kind = optimizer_kind(opt);
  if (it == states.end()) {
    if (!create) return {};
    if (kind == "sgd") states[key] = std::make_unique<torch::optim::SGDParamState>();
    else if (kind == "adam") states[key] = std::make_unique<torch::optim::AdamParamState>();
    else states[key] = std::make_unique<torch::optim::AdamWParamState>();
    it = states.find(key);
  }
  std::vector<std::pair<std::string, at::Tensor*>> out;
  *step = nullptr;
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    out.emplace_back("momentum_buffer", &const_cast<at::Tensor&>(s->momentum_buffer()));
  } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    out.emplace_back("exp_avg", &const_cast<at::Tensor&>(a->exp_avg()));
    out.emplace_back("exp_avg_sq", &const_cast<at::Tensor&>(a->exp_avg_sq()));
    out.emplace_back("max_exp_avg_sq", &const_cast<at::Tensor&>(a->max_exp_avg_sq()));
    *step = &const_cast<int64_t&>(a->step());
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    out.emplace_back("exp_avg", &const_cast<at::Tensor&>(w->exp_avg()));
    out.emplace_back("exp_avg_sq", &const_cast<at::Tensor&>(w->exp_avg_sq()));
    out.emplace_back("max_exp_avg_sq", &const_cast<at::Tensor&>(w->max_exp_avg_sq()));
    *step = &const_cast<int64_t&>(w->step());
  }
  return out;
}

void clear_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& states = opt.state();
  states.erase(state_key(states, p));
}

}  // namespace ckpt_detail

namespace {

std::vector<Item> inventory(torch::nn::Module& model, const ParallelReport& report) {
  const auto rows = rows_by_path(report);
  std::vector<Item> items;
  for (const auto& p : model.named_parameters()) {
    Item it{p.key(), p.value().detach(), p.value(), p.value().sizes().vec(), {}, ""};
    auto r = rows.find(p.key());
    if (r != rows.end()) {
      it.global_shape = r->second->global_shape;
      it.splits = r->second->splits;
      it.layout = r->second->layout;
    }
    items.push_back(it);
  }
  for (const auto& b : model.named_buffers())
    items.push_back(Item{b.key(), b.value().detach(), at::Tensor(), b.value().sizes().vec(), {}, "", true});
  return items;
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
                    " that is not a parameter of the model: build it over model.parameters() (for a "
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


// Every rank's text, on every rank.
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text) {
  at::Tensor len = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  at::Tensor lens = comm.all_gather(len, 0);
  int64_t longest = lens.max().item<int64_t>();
  at::Tensor buf = at::zeros({1, std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(buf.data_ptr(), text.data(), text.size());
  at::Tensor all = comm.all_gather(buf, 0).contiguous();
  std::vector<std::string> out;
  for (int64_t r = 0; r < comm.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all[r].data_ptr()), static_cast<size_t>(lens[r].item<int64_t>()));
  return out;
}

// Agreement on success: a rank that failed makes every rank throw, naming it,
// instead of leaving the others waiting in the next collective.
void agree(Communicator& comm, const std::string& my_error, const std::string& what) {
  auto errors = all_gather_text(comm, my_error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) throw Error(what + ": rank " + std::to_string(r) + ": " + errors[r]);
}


// Test hook (tests/e2e/ckpt_kill.sh): SHARDPLAN_TEST_CKPT_PAUSE_MS=N makes
// every rank announce itself on stderr and sleep N ms between writing its
// pieces and the metadata, the window in which a killed rank must leave the
// previous checkpoint intact.
void test_pause(int rank, const std::string& target) {
  const char* env = std::getenv("SHARDPLAN_TEST_CKPT_PAUSE_MS");
  if (!env || !*env) return;
  const long ms = std::atol(env);
  std::fprintf(stderr, "checkpoint test pause: rank %d pid %ld pausing %ld ms before publishing '%s'\n", rank,
               static_cast<long>(::getpid()), ms, target.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

namespace ckpt_detail {

at::Tensor take_splits(const at::Tensor& full, const std::vector<ShardSplit>& splits) {
  at::Tensor t = full;
  for (const auto& s : splits) t = take_split(t, s);
  return t.contiguous();
}

// A rank writes a piece only when it is the first holder of that piece: the
// ranks that differ from it only on axes the tensor is not split over hold
// copies.
bool writes_piece(const Mesh& mesh, int rank, const std::vector<ShardSplit>& splits) {
  if (mesh.ndim() == 0) return rank == 0;
  for (const auto& axis : mesh.axes()) {
    bool split = false;
    for (const auto& s : splits) split |= s.axis == axis.first;
    if (!split && mesh.coord(rank, axis.first) != 0) return false;
  }
  return true;
}

std::string rank_file(int rank) {
  std::ostringstream os;
  os << "rank-" << std::setw(5) << std::setfill('0') << rank << ".bin";
  return os.str();
}

}  // namespace ckpt_detail

// ------------------------------------------------------------------- public

StateDict local_state_dict(torch::nn::Module& model) {
  StateDict out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

StateDict collect_state_dict(torch::nn::Module& model, const ParallelReport& report, World& world, int root) {
  at::NoGradGuard no_grad;
  StateDict out;
  for (auto& item : inventory(model, report)) {
    at::Tensor t = item.local;
    for (auto s = item.splits.rbegin(); s != item.splits.rend(); ++s)
      t = gather_split(t, *s, item.global_shape[s->dim], *world.group(report.mesh, s->axis));
    if (root < 0 || world.rank() == root) out.emplace_back(item.name, t.contiguous());
  }
  return out;
}

StateDict relocate_state_dict(const StateDict& full, const ParallelReport& report) {
  const auto rows = rows_by_path(report);
  StateDict out;
  for (const auto& kv : full) {
    auto r = rows.find(kv.first);
    if (r == rows.end() || r->second->splits.empty()) {
      out.push_back(kv);
      continue;
    }
    const ReportRow& row = *r->second;
    if (kv.second.sizes().vec() != row.global_shape)
      throw Error("state dict: '" + kv.first + "' has shape " + shape_str(kv.second.sizes()) +
                  ", the model's is " + shape_str(row.global_shape));
    out.emplace_back(kv.first, take_splits(kv.second, row.splits));
  }
  return out;
}

void load_state_dict(torch::nn::Module& model, const StateDict& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  at::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, at::Tensor& dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("state dict has no '" + name + "'");
    if (it->second.sizes() != dst.sizes())
      throw Error("state dict: '" + name + "' has shape " + shape_str(it->second.sizes()) + ", the model's is " +
                  shape_str(dst.sizes()));
    dst.copy_(it->second);
  };
  for (auto& p : model.named_parameters()) copy(p.key(), p.value());
  for (auto& b : model.named_buffers()) copy(b.key(), b.value());
}

void save_checkpoint(const std::string& dir, torch::nn::Module& model, const ParallelReport& report, World& world,
                     const CheckpointOptions& options) {
  at::NoGradGuard no_grad;
  Communicator& comm = world.comm();
  const fs::path target = fs::absolute(dir).lexically_normal();
  const fs::path staging = target.string() + ".partial";
  const std::string what = "saving checkpoint '" + target.string() + "'";

  // Every step that can fail on one rank is followed by agree(), so all
  // ranks stop together instead of leaving the others in a collective. When
  // one fails, every rank has finished writing (agree is collective), so
  // rank 0 removes the staging directory: a failed save leaves nothing
  // behind. (A killed save does; the next save to `dir` replaces it.)
  std::map<std::string, std::string> attributes = options.attributes;
  std::vector<Item> items;
  std::string err;
  auto agree_or_clean_up = [&] {
    try {
      agree(comm, err, what);
    } catch (...) {
      std::error_code ec;
      if (world.rank() == 0) fs::remove_all(staging, ec);
      throw;
    }
  };
  try {
    items = inventory(model, report);
    add_optimizer_items(items, options, &attributes);
    // Rank 0 prepares the staging directory; a stale one from a crashed save
    // is discarded (the target is never touched until the final rename).
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove_all(staging, ec);
      fs::create_directories(staging);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_or_clean_up();

  // Each rank: its pieces into one file, described in a partial metadata.
  ckpt::Meta mine;
  std::string blob;
  try {
    const std::string file = rank_file(world.rank());
    for (const auto& item : items) {
      if (!writes_piece(report.mesh, world.rank(), item.splits)) continue;
      at::Tensor t = item.local.contiguous().cpu();
      ckpt::TensorEntry e;
      e.name = item.name;
      e.dtype = dtype_name(t.scalar_type());
      e.shape = item.global_shape;
      e.layout = item.layout;
      ckpt::Piece p;
      p.rank = world.rank();
      p.file = file;
      p.offset = blob.size();
      p.nbytes = t.numel() * t.element_size();
      p.shape = t.sizes().vec();
      for (const auto& s : item.splits) p.split.push_back(ckpt::DimSplit{s.dim, s.axis, s.parts, s.index, s.blocks});
      p.crc32c = ckpt::crc32c(t.data_ptr(), p.nbytes);
      blob.append(static_cast<const char*>(t.data_ptr()), p.nbytes);
      e.pieces.push_back(p);
      mine.tensors.push_back(e);
    }
    if (!blob.empty() || world.rank() == 0) ckpt::write_file_atomic((staging / file).string(), blob.data(), blob.size());
  } catch (const std::exception& e) {
    err = e.what();
  }
  test_pause(world.rank(), target.string());
  agree_or_clean_up();

  // Rank 0 merges the descriptions, writes the metadata, and swaps the
  // staging directory in.
  mine.world_size = world.size();
  mine.mesh = report.mesh.axes();
  auto texts = all_gather_text(comm, err.empty() ? ckpt::to_yaml(mine) : "");
  if (world.rank() == 0) {
    try {
      ckpt::Meta meta;
      meta.world_size = world.size();
      meta.mesh = report.mesh.axes();
      meta.attributes = attributes;
      meta.plan = report.plan_yaml;
      for (const auto& m : model.named_modules("", /*include_self=*/false)) meta.modules.push_back(m.key());
      std::map<std::string, size_t> index;
      for (const auto& item : items) {
        index[item.name] = meta.tensors.size();
        ckpt::TensorEntry e;
        e.name = item.name;
        e.shape = item.global_shape;
        e.layout = item.layout;
        e.buffer = item.buffer;
        e.dtype = dtype_name(item.local.scalar_type());
        meta.tensors.push_back(e);
      }
      for (const auto& text : texts) {
        const ckpt::Meta part = ckpt::parse_meta(text, "<rank metadata>", /*complete=*/false);
        for (const auto& e : part.tensors) {
          auto at = index.find(e.name);
          if (at == index.end()) throw Error("a rank wrote tensor '" + e.name + "', which rank 0 does not have");
          for (const auto& p : e.pieces) meta.tensors[at->second].pieces.push_back(p);
        }
      }
      const std::string yaml = ckpt::to_yaml(meta);
      ckpt::parse_meta(yaml, "<new metadata>");  // what we write must read back
      ckpt::write_file_atomic((staging / ckpt::kMetaFile).string(), yaml.data(), yaml.size());
      ckpt::replace_directory(staging.string(), target.string());
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  agree_or_clean_up();
}


std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options) {
  at::NoGradGuard no_grad;
  const fs::path target = fs::absolute(dir).lexically_normal();
  const std::string what = "loading checkpoint '" + target.string() + "'";
  // Everything is read, checked and cut into this rank's pieces first; only
  // when every rank has succeeded does any rank change its model or
  // optimizer, so a bad checkpoint leaves all of them as they were.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (model tensor, new value)
  std::vector<ParamState> opt_loads;  // fields empty: the parameter had no state yet
  std::optional<ckpt_detail::ZeroInstall> zero_install;
  torch::optim::Optimizer* optimizer = nullptr;
  std::string err;
  ckpt::Meta meta;
  try {
    optimizer = optimizer_of(options);
    meta = read_meta(target);
    const std::vector<Item> items = inventory(model, report);
    for (const auto& item : items) {
      const ckpt::TensorEntry* e = meta.find(item.name);
      if (!e) throw Error("the checkpoint has no tensor '" + item.name + "' (it has " +
                          std::to_string(meta.tensors.size()) + " tensors; a different model?)");
      if (e->shape != item.global_shape)
        throw Error("'" + item.name + "': the checkpoint's shape is " + shape_str(e->shape) + ", the model's " +
                    shape_str(item.global_shape));
    }
    for (const auto& item : items) {
      at::Tensor full = assemble(*meta.find(item.name), target).to(item.local.scalar_type());
      copies.emplace_back(item.local, take_splits(full, item.splits));
    }

    if (optimizer) {
      const auto it = meta.attributes.find("optimizer");
      const std::string kind = optimizer_kind(*optimizer);
      if (it == meta.attributes.end())
        throw Error("the checkpoint has no optimizer state (saved without an optimizer)");
      if (it->second != kind)
        throw Error("the checkpoint's optimizer state is " + it->second + "'s, the optimizer given is " + kind);
      if (!options.zero) check_optimizer_params(*optimizer, items);
      const std::vector<std::string> fields =
          kind == "sgd" ? std::vector<std::string>{"momentum_buffer"}
                        : std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
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
        opt_loads.push_back(std::move(load));
      }
      if (options.zero) zero_install.emplace(*options.zero, opt_loads);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(world.comm(), err, what);

  for (auto& c : copies) c.first.copy_(c.second);
  if (zero_install) {
    zero_install->apply();  // after the model: it refreshes the slices from it
  } else if (optimizer) {
    for (auto& load : opt_loads) {
      if (load.fields.empty()) {
        ckpt_detail::clear_state(*optimizer, load.param);  // as it was when saved: no state yet
        continue;
      }
      int64_t* step = nullptr;
      auto targets = state_tensors(*optimizer, load.param, true, &step);
      for (auto& f : load.fields)
        for (auto& t : targets)
          if (t.first == f.first) *t.second = f.second;
      if (step && load.step) *step = *load.step;
    }
  }
  return meta.attributes;
}

}  // namespace shardplan
