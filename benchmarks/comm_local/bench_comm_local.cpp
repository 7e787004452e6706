// bench_comm_local: all-reduce of the local backend at 2 ranks against the
// shared-memory roofline, measured in the same run.
//
//   bench_comm_local [--plugin PATH] [--reps R] [--latency-iters N] [--sizes-mib 16,64,128]
//
// Latency: float32 sum of 4 KiB in place, back to back, median per call on rank 0.
// Bandwidth: float32 sum of S bytes per rank, in place (the framework's
// Communicator::all_reduce) and out of place, median over R repetitions.
// Roofline: the same two threads doing a[i] += b[i] over halves of two S-byte
// arrays between two spin barriers -- the least work any 2-rank sum needs.
// Repetitions of all variants are interleaved, so noise from other processes
// hits them alike. ratio = roofline time / all-reduce time.
// `shardplan bench comm` shows the same roofline next to every backend; this
// program stays for its interleaved, 2-rank, float32 focus. Plugin loading
// and the roofline kernel come from that suite (tools/bench/comm).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "plugin.h"
#include "roofline.h"
#include "shardplan/abi/comm.h"
#include "shardplan/count_option.h"
#include "stats.h"

namespace {

using Clock = std::chrono::steady_clock;

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

using shardplan_bench::SpinBarrier;

double median(const std::vector<double>& v) { return shardplan_bench::median_of(v); }
double pct(const std::vector<double>& v, double p) { return shardplan_bench::percentile(v, p); }

sp_buffer fbuf(float* p, uint64_t n) {
  sp_buffer b{};
  b.data = p;
  b.count = n;
  b.dtype = SP_FLOAT32;
  b.device_type = SP_DEVICE_CPU;
  return b;
}

struct Row {
  size_t bytes = 0;
  std::vector<double> inplace, outplace, roof;
};

}  // namespace

int main(int argc, char** argv) {
  std::string plugin = SHARDPLAN_LOCAL_PLUGIN;
  int reps = 15;
  int lat_iters = 20000;
  std::vector<size_t> sizes_mib{16, 64, 128};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--plugin" && i + 1 < argc) {
      plugin = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = static_cast<int>(shardplan::count_or_exit(argv[0], a, argv[++i], 1, INT_MAX));
    } else if (a == "--latency-iters" && i + 1 < argc) {
      lat_iters = static_cast<int>(shardplan::count_or_exit(argv[0], a, argv[++i], 1, INT_MAX));
    } else if (a == "--sizes-mib" && i + 1 < argc) {
      sizes_mib.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        sizes_mib.push_back(shardplan::count_or_exit(argv[0], a, s.substr(p, q - p), 1, 1 << 20));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--plugin PATH] [--reps R] [--latency-iters N] [--sizes-mib 16,64,128]\n",
                   argv[0]);
      return 2;
    }
  }

  const sp_comm_api* api;
  try {
    api = shardplan_bench::open_comm_plugin(plugin);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm_local: %s\n", e.what());
    return 1;
  }

  const int n = 2;
  std::vector<double> latency;
  std::vector<Row> rows(sizes_mib.size());
  std::vector<float*> shared(n, nullptr);  // each rank's big buffer, for the roofline
  SpinBarrier roof_barrier(n);
  std::atomic<int> failures{0};

  auto rank_main = [&](int r) {
    const std::string opt = "local_id=bench_comm_local";
    const char* opts[] = {opt.c_str(), nullptr};
    sp_comm_config cfg{};
    cfg.struct_size = sizeof(cfg);
    cfg.rank = r;
    cfg.world_size = n;
    cfg.timeout_ms = 600000;
    cfg.options = opts;
    sp_comm* c = nullptr;
    if (api->create(&cfg, &c) != SP_OK) {
      std::fprintf(stderr, "rank %d: %s\n", r, api->last_error());
      ++failures;
      return;
    }
    auto check = [&](int st) {
      if (st != SP_OK) {
        std::fprintf(stderr, "rank %d: %s\n", r, api->last_error());
        ++failures;
        std::exit(1);
      }
    };

    // Latency at 4 KiB.
    {
      std::vector<float> x(1024, 0.f);
      sp_buffer b = fbuf(x.data(), x.size());
      for (int i = 0; i < 2000; ++i) check(api->all_reduce(c, &b, &b, SP_SUM, nullptr));
      std::vector<double> t;
      t.reserve(lat_iters);
      for (int i = 0; i < lat_iters; ++i) {
        auto t0 = Clock::now();
        check(api->all_reduce(c, &b, &b, SP_SUM, nullptr));
        t.push_back(secs(t0, Clock::now()));
      }
      if (r == 0) latency = std::move(t);
    }

    // Bandwidth.
    for (size_t s = 0; s < sizes_mib.size(); ++s) {
      const size_t bytes = sizes_mib[s] << 20, count = bytes / sizeof(float);
      // Zeros (written, so the pages exist): sums stay 0, never denormal or inf.
      std::vector<float> x(count, 0.f), y(count, 0.f);
      shared[r] = x.data();
      sp_buffer xb = fbuf(x.data(), count), yb = fbuf(y.data(), count);
      check(api->all_reduce(c, &xb, &xb, SP_SUM, nullptr));  // warm up, and publishes shared[]
      check(api->all_reduce(c, &xb, &yb, SP_SUM, nullptr));
      Row& row = rows[s];
      row.bytes = bytes;
      const size_t half = count / 2, lo = r * half, len = r == n - 1 ? count - lo : half;
      for (int k = 0; k < reps; ++k) {
        check(api->barrier(c, nullptr));
        auto t0 = Clock::now();
        check(api->all_reduce(c, &xb, &xb, SP_SUM, nullptr));
        auto t1 = Clock::now();
        check(api->barrier(c, nullptr));
        auto t2 = Clock::now();
        check(api->all_reduce(c, &xb, &yb, SP_SUM, nullptr));
        auto t3 = Clock::now();
        roof_barrier.wait();
        auto t4 = Clock::now();
        shardplan_bench::accumulate_f32(shared[0] + lo, shared[1] + lo, len);
        roof_barrier.wait();
        auto t5 = Clock::now();
        if (r == 0) {
          row.inplace.push_back(secs(t0, t1));
          row.outplace.push_back(secs(t2, t3));
          row.roof.push_back(secs(t4, t5));
        }
      }
      check(api->barrier(c, nullptr));  // nobody frees x while the peer's roofline reads it
    }
    api->destroy(c);
  };

  std::thread t1(rank_main, 1);
  rank_main(0);
  t1.join();
  if (failures) return 1;

  std::printf("local all-reduce, 2 ranks (threads), float32 sum\n\n");
  std::printf("latency 4 KiB in place: median %.2f us  (p10 %.2f, p90 %.2f; %d calls)\n\n", median(latency) * 1e6,
              pct(latency, 0.1) * 1e6, pct(latency, 0.9) * 1e6, lat_iters);
  std::printf("%-8s | %-22s | %-22s | %-22s | %-8s | %-8s\n", "size", "all_reduce in place", "all_reduce out of place",
              "roofline a[i]+=b[i]", "ratio in", "ratio out");
  std::printf("%-8s | %-22s | %-22s | %-22s | %-8s | %-8s\n", "", "ms      GB/s", "ms      GB/s", "ms      GB/s", "", "");
  for (const Row& row : rows) {
    const double ti = median(row.inplace), to = median(row.outplace), tr = median(row.roof);
    const double gb = row.bytes / 1e9;
    std::printf("%4zu MiB | %7.2f %9.2f     | %7.2f %9.2f     | %7.2f %9.2f     | %6.0f%%  | %6.0f%%\n",
                row.bytes >> 20, ti * 1e3, gb / ti, to * 1e3, gb / to, tr * 1e3, gb / tr, 100 * tr / ti,
                100 * tr / to);
  }
  std::printf("\nGB/s = bytes per rank / time; medians of %d interleaved repetitions.\n", reps);
  return 0;
}
