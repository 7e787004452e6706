// Sharded checkpoints with a world: every rank writes its pieces and rank 0
// the metadata, and a load reads, checks and cuts everything before any rank
// changes its model. (State dicts: checkpoint_state_dict.cpp; optimizer
// state: checkpoint_optimizer.cpp; reading pieces: checkpoint_offline.cpp.)
#include "shardplan/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "base/env.h"
#include "base/shape_text.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/communicator.h"
#include "shardplan/data_parallel.h"
#include "shardplan/zero_optimizer.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"
#include "checkpoint_internal.h"
#include "nn/deferred_internal.h"

namespace shardplan {

using ckpt_detail::add_optimizer_items;
using ckpt_detail::assemble;
using ckpt_detail::inventory;
using ckpt_detail::Item;
using ckpt_detail::optimizer_of;
using ckpt_detail::ModelTensors;
using ckpt_detail::ParamState;
using ckpt_detail::rank_file;
using ckpt_detail::read_meta;
using ckpt_detail::take_splits;
using ckpt_detail::writes_piece;

namespace fs = std::filesystem;

namespace {

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

}  // namespace

// ------------------------------------------------------------ tensor inventory

namespace ckpt_detail {

std::map<std::string, const ReportRow*> rows_by_path(const ParallelReport& report) {
  std::map<std::string, const ReportRow*> rows;
  for (const auto& row : report.rows)
    if (!row.global_shape.empty() || row.module_type.empty() || !row.path.empty()) rows.emplace(row.path, &row);
  return rows;
}

ModelTensors model_tensors(torch::nn::Module& model) {
  ModelTensors m;
  for (const auto& p : model.named_parameters()) m.parameters.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers()) m.buffers.emplace_back(b.key(), b.value());
  for (const auto& s : model.named_modules("", /*include_self=*/false)) m.modules.push_back(s.key());
  return m;
}

std::vector<Item> inventory(const ModelTensors& model, const ParallelReport& report) {
  const auto rows = rows_by_path(report);
  std::vector<Item> items;
  for (const auto& [name, value] : model.parameters) {
    Item it{name, value.detach(), value, value.sizes().vec(), {}, "", false, at::Tensor(), !model.copies.count(name)};
    auto r = rows.find(name);
    if (r != rows.end()) {
      it.global_shape = r->second->global_shape;
      it.splits = r->second->splits;
      it.layout = r->second->layout;
    }
    items.push_back(it);
  }
  for (const auto& [name, value] : model.buffers)
    items.push_back(
        Item{name, value.detach(), at::Tensor(), value.sizes().vec(), {}, "", true, at::Tensor(), !model.copies.count(name)});
  return items;
}

std::vector<Item> inventory(torch::nn::Module& model, const ParallelReport& report) {
  return inventory(model_tensors(model), report);
}

}  // namespace ckpt_detail

namespace {

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
  const long long ms = env::integer("SHARDPLAN_TEST_CKPT_PAUSE_MS", 0, 3600000, "a pause in milliseconds", -1);
  if (ms < 0) return;
  std::fprintf(stderr, "checkpoint test pause: rank %d pid %ld pausing %lld ms before publishing '%s'\n", rank,
               static_cast<long>(::getpid()), ms, target.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Another pipeline stage's parameters hold no values on this rank: a
// checkpoint of them would be zeros.
void refuse_released(const std::vector<Item>& items) {
  for (const auto& item : items)
    if (item.param.defined() && nn::is_deferred(item.param) && nn::detail::over_zero_page(item.param))
      throw Error("parameter '" + item.name +
                  "' holds no values on this rank (deferred and never loaded, or another pipeline stage's): a "
                  "pipelined model is saved with save_checkpoint(dir, pipeline, ...) of shardplan/pipeline_checkpoint.h");
}

// This rank's pieces of `items` into its one file under `staging`; what it
// wrote, as a partial metadata.
ckpt::Meta write_pieces(const std::vector<Item>& items, const ModelTensors& model, const ParallelReport& report,
                        int rank, const fs::path& staging) {
  ckpt::Meta mine;
  std::string blob;
  const std::string file = rank_file(rank);
  for (const auto& item : items) {
    if (!item.written || !writes_piece(report.mesh, rank, item.splits, model.apart_axis)) continue;
    at::Tensor t = item.local.contiguous().cpu();
    ckpt::TensorEntry e;
    e.name = item.name;
    e.dtype = dtype_name(t.scalar_type());
    e.shape = item.global_shape;
    e.layout = item.layout;
    e.buffer = item.buffer;
    ckpt::Piece p;
    p.rank = rank;
    p.file = file;
    p.offset = blob.size();
    p.nbytes = t.numel() * t.element_size();
    p.shape = t.sizes().vec();
    for (const auto& s : item.splits) p.split.push_back(ckpt::DimSplit{s.dim, s.axis, s.parts, s.index, s.blocks, s.shared});
    p.crc32c = ckpt::crc32c(t.data_ptr(), p.nbytes);
    blob.append(static_cast<const char*>(t.data_ptr()), p.nbytes);
    e.pieces.push_back(p);
    mine.tensors.push_back(e);
  }
  if (!blob.empty() || rank == 0) ckpt::write_file_atomic((staging / file).string(), blob.data(), blob.size());
  return mine;
}

// Rank 0: the whole metadata from its own items and every rank's partial
// one (`texts`). Without a pipeline every rank has rank 0's tensors; with
// one, a later stage's are described by the ranks that wrote them.
ckpt::Meta merged_meta(const std::vector<Item>& items, const ModelTensors& model, const ParallelReport& report,
                       const std::map<std::string, std::string>& attributes, const std::vector<std::string>& texts) {
  ckpt::Meta meta;
  meta.world_size = static_cast<int>(texts.size());
  meta.mesh = report.mesh.axes();
  meta.attributes = attributes;
  meta.plan = report.plan_yaml;
  meta.modules = model.modules;
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
      if (at == index.end() && model.apart_axis.empty())
        throw Error("a rank wrote tensor '" + e.name + "', which rank 0 does not have");
      if (at == index.end()) {
        at = index.emplace(e.name, meta.tensors.size()).first;
        meta.tensors.push_back(e);
        meta.tensors.back().pieces.clear();
      }
      for (const auto& p : e.pieces) meta.tensors[at->second].pieces.push_back(p);
    }
    meta.attributes.insert(part.attributes.begin(), part.attributes.end());  // rank 0's kept
  }
  return meta;
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
// copies, and so do the next ranks of an axis whose pieces are shared.
bool writes_piece(const Mesh& mesh, int rank, const std::vector<ShardSplit>& splits, const std::string& apart_axis) {
  if (mesh.ndim() == 0) return rank == 0;
  for (const auto& axis : mesh.axes()) {
    if (axis.first == apart_axis) continue;
    int64_t shared = 0;  // 0: not split over this axis
    for (const auto& s : splits)
      if (s.axis == axis.first) shared = s.shared;
    if (mesh.coord(rank, axis.first) % (shared ? shared : axis.second) != 0) return false;
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

// ZeRO-3: the parameters are whole for the checkpoint's life (the format is
// ZeRO-1's: whole parameters, sliced optimizer state), and a load's values
// go back into this rank's slices when it ends.
void save_checkpoint(const std::string& dir, torch::nn::Module& model, const ParallelReport& report, World& world,
                     const CheckpointOptions& options) {
  std::optional<DataParallel::WholeParameters> whole;
  if (options.zero) whole.emplace(options.zero->data_parallel());
  ckpt_detail::save_model_checkpoint(dir, ckpt_detail::model_tensors(model), report, world, options);
}

std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options) {
  std::optional<DataParallel::WholeParameters> whole;
  if (options.zero) whole.emplace(options.zero->data_parallel());
  return ckpt_detail::load_model_checkpoint(dir, ckpt_detail::model_tensors(model), report, world, options);
}

void ckpt_detail::save_model_checkpoint(const std::string& dir, const ModelTensors& model,
                                        const ParallelReport& report, World& world,
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
    refuse_released(items);
    ckpt_detail::use_masters(items, options, nullptr);
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
  try {
    mine = write_pieces(items, model, report, world.rank(), staging);
  } catch (const std::exception& e) {
    err = e.what();
  }
  test_pause(world.rank(), target.string());
  agree_or_clean_up();

  // Rank 0 merges the descriptions, writes the metadata, and swaps the
  // staging directory in.
  mine.world_size = world.size();
  mine.mesh = report.mesh.axes();
  mine.attributes = attributes;  // a pipeline stage's optimizer steps are its own
  auto texts = all_gather_text(comm, err.empty() ? ckpt::to_yaml(mine) : "");
  if (world.rank() == 0) {
    try {
      ckpt::Meta meta = merged_meta(items, model, report, attributes, texts);
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

std::map<std::string, std::string> ckpt_detail::load_model_checkpoint(const std::string& dir,
                                                                     const ModelTensors& model,
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
    std::vector<Item> items = inventory(model, report);
    ckpt_detail::use_masters(items, options, &meta);
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
      if (item.model.defined()) copies.emplace_back(item.model, copies.back().second);
    }

    if (optimizer) {
      opt_loads = ckpt_detail::read_optimizer_states(*optimizer, options, meta, target, items);
      if (options.zero) {
        std::map<const void*, at::Tensor> values;  // masters, loaded in their dtype
        for (const auto& item : items)
          if (item.model.defined()) values[item.param.unsafeGetTensorImpl()] = item.local;
        zero_install.emplace(*options.zero, opt_loads, std::move(values));
      }
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(world.comm(), err, what);

  for (auto& c : copies) c.first.copy_(c.second);
  if (zero_install) {
    zero_install->apply();  // after the model: it refreshes the slices from it
  } else if (optimizer) {
    ckpt_detail::install_optimizer_states(*optimizer, opt_loads);
  }
  return meta.attributes;
}

}  // namespace shardplan
