// load_weights into a ZeRO-3 DataParallel's slices (weights.h, load_weights
// with a DataParallel): each rank copies only its 1/D slice of its TP shard.
// At {data: 2}, {data: 4} and {data: 2, model: 2}: the slices equal those of
// loading whole and then making the DataParallel (bit for bit; also renamed
// and lenient), the bytes copied are the slices', training after the load
// equals one process (float64, 1e-10, Adam), a model built under
// DeferredInit gives no rank its whole shard, and bad input changes no slice.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/weights.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"
#include "weights_util.h"

namespace test_zero3_weights {

namespace {

using namespace dp_test;
namespace fs = std::filesystem;

struct Mesh {
  const char* name;
  std::string plan;
  int world, data;
};
// With `ignore`, {data: 2, model: 2} ignores one bias: kept whole and loaded
// whole (and stepped with each rank's own gradient, unlike one process).
std::vector<Mesh> meshes(bool ignore) {
  const std::string zero3_2d = ignore ? "data_parallel: {zero: 3, ignore: ['blocks\\.0\\.fc1\\.bias']}\n"
                                      : "data_parallel: {zero: 3}\n";
  return {{"{data: 2}", "version: 1\nmesh: {data: 2}\ndata_parallel: {zero: 3}\nrules: []\n", 2, 2},
          {"{data: 4}", plan_dp("data_parallel: {zero: 3}\n"), 4, 4},
          {"{data: 2, model: 2}", plan_2d(kGptRules, zero3_2d), 4, 2}};
}

// The task's GPT with other values, written whole to `dir`/w.safetensors in `dtype`.
fs::path write_weights(const Task& task, const fs::path& dir, at::ScalarType dtype) {
  auto m = task.model->clone();
  torch::manual_seed(17);
  shardplan::StateDict sd;
  for (const auto& kv : m->named_parameters()) sd.emplace_back(kv.key(), torch::randn(kv.value().sizes()).to(dtype));
  fs::create_directories(dir);
  const fs::path path = dir / "w.safetensors";
  shardplan::write_safetensors(path.string(), sd);
  return path;
}

std::vector<torch::Tensor> slices_of(shardplan::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& b : opt.zero()->layout()) out.push_back(b.slice.clone());
  return out;
}

// Bytes of the parameters' elements this rank's slices cover (the padding
// excluded), plus the parameters kept whole.
int64_t slice_bytes(shardplan::Optimizer& opt, int data_rank, const torch::Tensor* skip = nullptr) {
  int64_t n = 0;
  for (const auto& b : opt.zero()->layout()) {
    const int64_t lo = data_rank * b.slice.numel(), hi = lo + b.slice.numel();
    for (const auto& [p, offset] : b.members)
      if (!skip || !p.is_same(*skip))
        n += std::max<int64_t>(0, std::min(offset + p.numel(), hi) - std::max(offset, lo)) * b.slice.element_size();
  }
  for (const auto& p : opt.zero()->locals()) n += p.numel() * p.element_size();
  return n;
}

struct RankLoad {
  std::vector<torch::Tensor> slices;
  std::vector<torch::Tensor> whole;  // the parameters kept whole
  int64_t bytes = 0, expected_bytes = 0, shard_bytes = 0;
  int data_rank = 0;
};

std::vector<torch::Tensor> locals_of(shardplan::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& p : opt.zero()->locals()) out.push_back(p.detach().clone());
  return out;
}

// Each rank of `m`: load into the slices (into_slices) or load whole, then
// make the DataParallel (what the trainers did before).
std::vector<RankLoad> load_on_ranks(const Task& task, const Mesh& m, const fs::path& file, bool into_slices,
                                    const shardplan::WeightsOptions& options = {},
                                    const std::string& missing = "") {
  const auto plan = shardplan::parse_plan(m.plan);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < m.world; ++r) replicas.push_back(task.model->clone());
  std::vector<RankLoad> out(m.world);
  shardplan::run_ranks_in_threads(m.world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    RankLoad& r = out[w.rank()];
    std::unique_ptr<shardplan::Training> t;
    if (into_slices) {
      t = std::make_unique<shardplan::Training>(shardplan::parallelize_for_training(model, plan, w));
      r.bytes = shardplan::load_weights(*t->data_parallel, model, t->report, file.string(), options).bytes_copied;
    } else {
      const auto report = shardplan::parallelize(model, plan, w);
      r.bytes = shardplan::load_weights(model, report, file.string(), options).bytes_copied;
      for (const auto& p : model.parameters()) r.shard_bytes += p.numel() * p.element_size();
      t = std::make_unique<shardplan::Training>();
      t->report = report;
      t->data_parallel = std::make_unique<DataParallel>(model, report, plan, w);
    }
    shardplan::Optimizer opt(*t->data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    r.data_rank = t->data_parallel->rank();
    r.slices = slices_of(opt);
    r.whole = locals_of(opt);
    const auto named = model.named_parameters();
    const torch::Tensor* skip = missing.empty() ? nullptr : named.find(missing);
    r.expected_bytes = slice_bytes(opt, r.data_rank, skip);
  });
  return out;
}

int64_t bytes_of(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel() * t.element_size();
  return n;
}

void expect_bitwise(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(got[i].sizes() == want[i].sizes() && torch::equal(got[i], want[i])) << what << " " << i << " differs";
}

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("shardplan_zero3_weights_" + name + "_" + std::to_string(::getpid()));
}

TEST(Zero3Weights, SlicesEqualLoadingWholeThenDataParallel) {
  const Task task = gpt_task(1, 8);
  const fs::path dir = temp("slices");
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {  // float32 file: converted on the way
    const fs::path file = write_weights(task, dir, dtype);
    for (const Mesh& m : meshes(true)) {
      SCOPED_TRACE(std::string(m.name) + " file " + c10::toString(dtype));
      const auto sliced = load_on_ranks(task, m, file, true);
      const auto whole = load_on_ranks(task, m, file, false);
      const int model_ranks = m.world / m.data;
      std::vector<int64_t> sum_over_data(model_ranks, 0);
      for (int r = 0; r < m.world; ++r) {
        expect_bitwise(sliced[r].slices, whole[r].slices, "rank " + std::to_string(r) + " slices");
        expect_bitwise(sliced[r].whole, whole[r].whole, "rank " + std::to_string(r) + " whole parameters");
        EXPECT_EQ(sliced[r].bytes, sliced[r].expected_bytes) << "rank " << r;
        EXPECT_EQ(whole[r].bytes, whole[r].shard_bytes) << "rank " << r;
        // The data ranks of one model rank copy its shard once between them
        // (each of them what is kept whole).
        sum_over_data[r % model_ranks] += sliced[r].bytes - bytes_of(sliced[r].whole);
      }
      for (int r = 0; r < model_ranks; ++r)
        EXPECT_EQ(sum_over_data[r], whole[r].shard_bytes - bytes_of(whole[r].whole)) << "model rank " << r;
    }
  }
  fs::remove_all(dir);
}

// GPT-2's Conv1D layout (WeightsOptions::transposed): the 2-D projections
// stored [in, out] load into the slices as the model-layout file does.
TEST(Zero3Weights, TransposedTensorsLoadIntoTheSlicesAsThePlainFile) {
  const Task task = gpt_task(1, 8);
  const fs::path dir = temp("transposed");
  const fs::path file = write_weights(task, dir, at::kDouble);
  const std::string pattern = R"(blocks\.\d+\.(attn\.in_proj_weight|attn\.out_proj\.weight|fc[12]\.weight))";
  shardplan::StateDict conv1d;
  for (auto& [name, t] : shardplan::read_weights(file.string()))
    conv1d.emplace_back(name, std::regex_match(name, std::regex(pattern)) ? t.t().contiguous() : t);
  const fs::path transposed_file = dir / "conv1d.safetensors";
  shardplan::write_safetensors(transposed_file.string(), conv1d);
  shardplan::WeightsOptions o;
  o.transposed = {pattern};
  for (const Mesh& m : meshes(false)) {
    SCOPED_TRACE(m.name);
    const auto want = load_on_ranks(task, m, file, true);
    const auto got = load_on_ranks(task, m, transposed_file, true, o);
    for (int r = 0; r < m.world; ++r) {
      expect_bitwise(got[r].slices, want[r].slices, "rank " + std::to_string(r) + " slices");
      expect_bitwise(got[r].whole, want[r].whole, "rank " + std::to_string(r) + " whole parameters");
      EXPECT_EQ(got[r].bytes, got[r].expected_bytes) << "rank " << r;
    }
  }
  fs::remove_all(dir);
}

// Names renamed and a tensor missing (strict = false): the slices keep the
// missing parameter's values and take the others', as loading whole does.
TEST(Zero3Weights, RenamedAndLenientLoadsEqualLoadingWhole) {
  const Task task = gpt_task(1, 8);
  const fs::path dir = temp("lenient");
  shardplan::StateDict sd;
  torch::manual_seed(19);
  for (const auto& kv : task.model->named_parameters())
    if (kv.key() != "blocks.1.fc2.weight") sd.emplace_back("transformer." + kv.key(), torch::randn(kv.value().sizes()));
  fs::create_directories(dir);
  const fs::path file = dir / "w.safetensors";
  shardplan::write_safetensors(file.string(), sd);
  shardplan::WeightsOptions options;
  options.rename = {{"^transformer\\.", ""}};
  options.strict = false;
  const Mesh m = meshes(true)[2];
  const auto sliced = load_on_ranks(task, m, file, true, options, "blocks.1.fc2.weight");
  const auto whole = load_on_ranks(task, m, file, false, options);
  for (int r = 0; r < m.world; ++r) {
    expect_bitwise(sliced[r].slices, whole[r].slices, "rank " + std::to_string(r) + " slices");
    expect_bitwise(sliced[r].whole, whole[r].whole, "rank " + std::to_string(r) + " whole parameters");
    // All but blocks.1.fc2.weight's part of the slices was copied.
    EXPECT_EQ(sliced[r].bytes, sliced[r].expected_bytes) << "rank " << r;
  }
  fs::remove_all(dir);
}

// Adam steps on `m` after loading `file` into the slices of a model built
// as `task`'s (or under DeferredInit): rank 0's global mean losses.
std::vector<double> train_after_load(const Task& task, const Mesh& m, const fs::path& file, bool deferred) {
  const auto plan = shardplan::parse_plan(m.plan);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < m.world; ++r) {
    if (!deferred) {
      replicas.push_back(task.model->clone());
      continue;
    }
    shardplan::nn::DeferredInit no_memory(at::kDouble);
    replicas.push_back(shardplan::examples::make_model("gpt", {{"vocab", "32"}, {"context", "6"}, {"embed", "16"},
                                                                {"heads", "4"}, {"layers", "2"}, {"mlp", "24"}})
                           .module);
  }
  std::vector<double> losses;
  std::mutex mu;
  shardplan::run_ranks_in_threads(m.world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    shardplan::load_weights(*t.data_parallel, model, t.report, file.string());
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    for (const auto& [x, y] : task.batches) {
      opt.zero_grad();
      auto loss = task.loss(model, t.local_batch(x), t.local_batch(y));
      loss.backward();
      opt.step();
      const double mean = t.average(loss.item<double>());
      std::lock_guard<std::mutex> lock(mu);
      if (w.rank() == 0) losses.push_back(mean);
    }
  });
  return losses;
}

// One process that loaded the same file trains the same (float64, 1e-10).
RefRun reference_after_load(const Task& task, const fs::path& file) {
  Task loaded = task;
  loaded.model = task.model->clone();
  shardplan::load_weights(*loaded.model, shardplan::ParallelReport{}, file.string());
  return reference(loaded, true);
}

TEST(Zero3Weights, TrainingAfterTheLoadMatchesOneProcess) {
  const Task task = gpt_task(3, 8);
  const fs::path dir = temp("train");
  const fs::path file = write_weights(task, dir, at::kDouble);
  const RefRun ref = reference_after_load(task, file);
  for (const Mesh& m : meshes(false)) {
    SCOPED_TRACE(m.name);
    expect_same_losses(train_after_load(task, m, file, false), ref.losses);
  }
  fs::remove_all(dir);
}

// Built under DeferredInit, sharded by the plan and given to DataParallel,
// the model takes memory for this rank's slices only: no allocation is
// larger than the largest slice (the TP shards stay over the zero page and
// no unit is flattened whole); then it trains as one process does.
TEST(Zero3Weights, DeferredModelNeverHoldsItsWholeShard) {
  static weights_test::CountingAllocator counting;  // outlives every tensor it allocates
  const Mesh m = meshes(true)[2];
  const auto plan = shardplan::parse_plan(m.plan);
  const shardplan::examples::Overrides big = {{"vocab", "256"}, {"context", "8"}, {"embed", "64"},
                                              {"heads", "4"},   {"layers", "2"},  {"mlp", "256"}};
  const fs::path dir = temp("deferred");
  Task big_task;
  big_task.model = shardplan::examples::make_model("gpt", big).module;
  const fs::path big_file = write_weights(big_task, dir / "big", at::kDouble);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < m.world; ++r) {
    shardplan::nn::DeferredInit no_memory(at::kDouble);
    replicas.push_back(shardplan::examples::make_model("gpt", big).module);
  }
  std::vector<int64_t> largest_slice(m.world, 0), copied(m.world, 0), slices(m.world, 0);
  c10::Allocator* original = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  counting.on = true;
  shardplan::run_ranks_in_threads(m.world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    copied[w.rank()] = shardplan::load_weights(*t.data_parallel, model, t.report, big_file.string()).bytes_copied;
    w.comm().barrier();
    if (w.rank() == 0) counting.on = false;
    w.comm().barrier();
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    for (const auto& b : opt.zero()->layout()) {
      largest_slice[w.rank()] = std::max<int64_t>(largest_slice[w.rank()], b.slice.nbytes());
      slices[w.rank()] += b.slice.nbytes();
    }
  });
  counting.on = false;
  c10::SetCPUAllocator(original, 100);
  const int64_t slice = *std::max_element(largest_slice.begin(), largest_slice.end());
  EXPECT_LE(counting.largest.load(), slice) << "a block larger than any slice was allocated";
  for (int r = 0; r < m.world; ++r) EXPECT_LE(copied[r], slices[r] + 128 * 8) << "rank " << r;  // + the ignored bias
  // The small GPT built the same way trains as one process does.
  const Task task = gpt_task(3, 8);
  const fs::path file = write_weights(task, dir / "small", at::kDouble);
  expect_same_losses(train_after_load(task, meshes(false)[2], file, true), reference_after_load(task, file).losses);
  fs::remove_all(dir);
}

// The error of load_weights(dp, ...) on a bad file, which must equal the
// plain load's on the same plan's shards, and leave every slice as it was.
std::string expect_refused(const Task& task, const Mesh& m, const fs::path& bad) {
  const auto plan = shardplan::parse_plan(m.plan);
  std::vector<std::shared_ptr<torch::nn::Module>> zero3, plain;
  for (int r = 0; r < m.world; ++r) {
    zero3.push_back(task.model->clone());
    plain.push_back(task.model->clone());
  }
  std::vector<std::string> got(m.world), want(m.world);
  shardplan::run_ranks_in_threads(m.world, [&](shardplan::World& w) {
    auto& model = *zero3[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    const auto before = slices_of(opt);
    try {
      shardplan::load_weights(*t.data_parallel, model, t.report, bad.string());
    } catch (const shardplan::Error& e) {
      got[w.rank()] = e.what();
    }
    expect_bitwise(slices_of(opt), before, "slices after a refused load");
    const auto report = shardplan::parallelize(*plain[w.rank()], plan, w);
    try {
      shardplan::load_weights(*plain[w.rank()], report, bad.string());
    } catch (const shardplan::Error& e) {
      want[w.rank()] = e.what();
    }
  });
  for (int r = 0; r < m.world; ++r) {
    EXPECT_FALSE(got[r].empty()) << "rank " << r << " loaded " << bad;
    EXPECT_EQ(got[r], want[r]) << "rank " << r;
    EXPECT_EQ(got[r].find('\n'), std::string::npos) << got[r];
  }
  return got[0];
}

TEST(Zero3Weights, BadInputChangesNoSlice) {
  const Task task = gpt_task(1, 8);
  const Mesh m = meshes(true)[2];
  const fs::path dir = temp("bad");
  shardplan::StateDict sd;
  for (const auto& kv : task.model->named_parameters()) sd.emplace_back(kv.key(), kv.value().detach() + 1);
  auto write = [&](const std::string& name, const shardplan::StateDict& d) {
    const fs::path p = dir / name;
    shardplan::write_safetensors(p.string(), d);
    return p;
  };
  fs::create_directories(dir);
  const fs::path truncated = write("truncated.safetensors", sd);
  fs::resize_file(truncated, fs::file_size(truncated) - 100);
  EXPECT_NE(expect_refused(task, m, truncated).find("truncated.safetensors"), std::string::npos);
  shardplan::StateDict missing(sd.begin() + 1, sd.end());
  EXPECT_NE(expect_refused(task, m, write("missing.safetensors", missing)).find("missing from the file: '" + sd[0].first),
            std::string::npos);
  shardplan::StateDict reshaped = sd;
  for (auto& [name, t] : reshaped)
    if (name == "blocks.1.fc1.weight") t = torch::zeros({t.size(0) + 2, t.size(1)}, t.options());
  EXPECT_NE(expect_refused(task, m, write("shape.safetensors", reshaped)).find("'blocks.1.fc1.weight'"),
            std::string::npos);
  fs::remove_all(dir);
}

// While the parameters are whole (WholeParameters) the slices cannot be
// loaded, a plain load_weights on a ZeRO-3 model refuses its free
// parameters, and a DataParallel of another model is refused: one line
// each, nothing changed.
TEST(Zero3Weights, WholeOrFreeParametersAreRefused) {
  const Task task = gpt_task(1, 8);
  const Mesh m = meshes(true)[2];
  const fs::path dir = temp("whole");
  const fs::path file = write_weights(task, dir, at::kDouble);
  const auto plan = shardplan::parse_plan(m.plan);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < m.world; ++r) replicas.push_back(task.model->clone());
  std::vector<std::shared_ptr<torch::nn::Module>> others;
  for (int r = 0; r < m.world; ++r) others.push_back(task.model->clone());
  std::vector<std::string> inside(m.world), plain(m.world), other(m.world);
  shardplan::run_ranks_in_threads(m.world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    const auto other_report = shardplan::parallelize(*others[w.rank()], plan, w);
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    const auto before = slices_of(opt);
    {
      const DataParallel::WholeParameters whole(*t.data_parallel);
      try {
        shardplan::load_weights(*t.data_parallel, model, t.report, file.string());
      } catch (const shardplan::Error& e) {
        inside[w.rank()] = e.what();
      }
    }
    try {
      shardplan::load_weights(model, t.report, file.string());
    } catch (const shardplan::Error& e) {
      plain[w.rank()] = e.what();
    }
    try {
      shardplan::load_weights(*t.data_parallel, *others[w.rank()], other_report, file.string());
    } catch (const shardplan::Error& e) {
      other[w.rank()] = e.what();
    }
    expect_bitwise(slices_of(opt), before, "slices after the refused loads");
  });
  for (int r = 0; r < m.world; ++r) {
    EXPECT_NE(other[r].find("made over another model"), std::string::npos) << other[r];
    EXPECT_NE(inside[r].find("WholeParameters"), std::string::npos) << inside[r];
    EXPECT_NE(plain[r].find("free between uses under ZeRO-3"), std::string::npos) << plain[r];
  }
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_zero3_weights
