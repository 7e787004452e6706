#include "interleaved.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>
#include <type_traits>

#include "shardplan/count_option.h"
#include "stats.h"

namespace shardplan_bench {

PluginReduceSide::PluginReduceSide(const sp_comm_api* api, int rank, int size, int64_t timeout_ms,
                                   const std::vector<std::string>& options)
    : api_(api) {
  std::vector<const char*> opts;
  for (const std::string& s : options) opts.push_back(s.c_str());
  opts.push_back(nullptr);
  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = size;
  cfg.timeout_ms = timeout_ms;
  cfg.options = opts.data();
  if (api_->create(&cfg, &comm_) != SP_OK)
    throw std::runtime_error(std::string(api_->name) + " create: " + api_->last_error());
}

PluginReduceSide::~PluginReduceSide() {
  if (comm_) api_->destroy(comm_);
}

void PluginReduceSide::all_reduce(float* data, size_t n) {
  sp_buffer b{};
  b.data = data;
  b.count = n;
  b.dtype = SP_FLOAT32;
  b.device_type = SP_DEVICE_CPU;
  if (api_->all_reduce(comm_, &b, &b, SP_SUM, nullptr) != SP_OK) throw std::runtime_error(api_->last_error());
}

void PluginReduceSide::barrier() {
  if (api_->barrier(comm_, nullptr) != SP_OK) throw std::runtime_error(api_->last_error());
}

bool parse_interleaved_args(int argc, char** argv, InterleavedArgs& args, int* ranks, std::string* why) {
  InterleavedOptions& o = args.options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--control") {
      args.control = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) return false;
    ++i;
    // Anything but a whole number in range is a usage error, not 0 or 1.
    auto count = [&](long long lo, long long hi, auto& field) {
      const auto n = shardplan::whole_number(v, lo, hi);
      if (n) field = static_cast<std::remove_reference_t<decltype(field)>>(*n);
      if (!n && why) *why = shardplan::count_error(a, v, lo, hi);
      return n.has_value();
    };
    bool ok = true;
    if (a == "--scale") ok = count(1, INT_MAX, o.scale);
    else if (a == "--min-bytes") ok = count(sizeof(float), LLONG_MAX, o.min_bytes);
    else if (a == "--max-bytes") ok = count(sizeof(float), LLONG_MAX, o.max_bytes);
    else if (a == "--plugin") args.plugin = v;
    else if (a == "--ranks" && ranks) ok = count(1, 4096, *ranks);
    else return false;
    if (!ok) return false;
  }
  // Counts go to MPI and gloo as ints.
  return o.scale >= 1 && o.min_bytes >= sizeof(float) && o.max_bytes >= o.min_bytes &&
         o.max_bytes / sizeof(float) <= static_cast<size_t>(INT_MAX) && (!ranks || *ranks >= 1);
}

namespace {

using Clock = std::chrono::steady_clock;

// Calls per block and blocks per side; equal on every rank, so they may not
// depend on local timing.
int calls_per_block(size_t bytes) { return static_cast<int>(std::clamp<size_t>((size_t(4) << 20) / bytes, 1, 20)); }
int blocks_for(size_t bytes, int scale) {
  const size_t per_block = bytes * calls_per_block(bytes);
  return static_cast<int>(std::clamp<size_t>((size_t(128) << 20) * scale / per_block, 8, 100 * scale));
}

// Mean time per call over one block. The barrier first lets the ranks start
// together, so a late rank does not bill its delay to the other side.
double time_block(ReduceSide& side, std::vector<float>& buf, int calls) {
  side.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) side.all_reduce(buf.data(), buf.size());
  return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
}

// 1027 elements: odd, and not a multiple of any rank count a ring splits by.
void check_sum(ReduceSide& side, const InterleavedOptions& o, const std::string& name) {
  std::vector<float> v(1027, float(o.rank + 1));
  side.all_reduce(v.data(), v.size());
  const float want = float(o.size * (o.size + 1) / 2);
  for (float x : v)
    if (x != want)
      throw std::runtime_error(name + " all_reduce gave " + std::to_string(x) + ", expected " + std::to_string(want));
}

std::string human(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t(1) << 20)) std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  else std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

}  // namespace

void run_interleaved(ReduceSide& tested, ReduceSide& raw, const InterleavedOptions& o) {
  check_sum(tested, o, o.tested_name);
  check_sum(raw, o, o.raw_name);
  if (o.rank == 0) {
    std::printf("%s\n", o.title.c_str());
    std::printf("%9s %5s %6s %14s %14s %10s %12s %11s\n", "size", "calls", "blocks", (o.raw_name + " (us)").c_str(),
                (o.tested_name + " (us)").c_str(), "raw GB/s", (o.tested_name + " GB/s").c_str(),
                (o.tested_name + "/raw").c_str());
    std::fflush(stdout);
  }
  for (size_t bytes = std::max<size_t>(o.min_bytes, sizeof(float)); bytes <= o.max_bytes; bytes *= 4) {
    std::vector<float> a(bytes / sizeof(float), 0.0f), b(bytes / sizeof(float), 0.0f);
    const int calls = calls_per_block(bytes), blocks = blocks_for(bytes, o.scale);
    time_block(tested, a, calls);  // warm-up: first touch, socket buffers
    time_block(raw, b, calls);
    std::vector<double> tp, tr, ratio;
    for (int k = 0; k < blocks; ++k) {
      double p, w;
      if (k % 2 == 0) {
        p = time_block(tested, a, calls);
        w = time_block(raw, b, calls);
      } else {
        w = time_block(raw, b, calls);
        p = time_block(tested, a, calls);
      }
      tp.push_back(p);
      tr.push_back(w);
      ratio.push_back(w / p);
    }
    if (o.rank == 0) {
      const double p = median_of(tp), w = median_of(tr);
      std::printf("%9s %5d %6d %14.1f %14.1f %10.3f %12.3f %11.2f\n", human(bytes).c_str(), calls, blocks, w * 1e6,
                  p * 1e6, bytes / w / 1e9, bytes / p / 1e9, median_of(ratio));
      std::fflush(stdout);
    }
  }
}

}  // namespace shardplan_bench
