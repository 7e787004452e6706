// comm_conformance: runs the conformance suite (conformance.h) on a backend.
//
//   comm_conformance --backend B --threads N   ranks are N threads of this process
//   comm_conformance [--backend B]             one rank of a multi-process job,
//                                              from the launcher's environment
//   --option KEY=VALUE                         a backend option (repeatable)
//
// Prints every failure, then a last line "N passed, M failed" (summed over the
// thread ranks, or this rank's own counts), and exits non-zero on any failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "conformance.h"
#include "shardplan/world.h"

namespace {

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--backend B] [--threads N] [--timeout-ms T] [--quick] [--option KEY=VALUE]...\n"
               "  --threads N   run N ranks as threads of this process\n"
               "                (without it: one rank of a job described by the environment)\n"
               "  --quick       counts {0, 7, 1023} only\n"
               "  --option      passed to the backend plugin (gloo: blocking=inline)\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend;
  int threads = 0;
  long long timeout_ms = 0;
  shardplan::conformance::Options options;
  std::vector<std::string> backend_options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--backend") {
      const char* v = value();
      if (!v) return usage(argv[0]);
      backend = v;
    } else if (a == "--threads") {
      const char* v = value();
      if (!v || (threads = std::atoi(v)) < 1) return usage(argv[0]);
    } else if (a == "--timeout-ms") {
      const char* v = value();
      if (!v || (timeout_ms = std::atoll(v)) < 1) return usage(argv[0]);
    } else if (a == "--option") {
      const char* v = value();
      if (!v || !std::strchr(v, '=')) return usage(argv[0]);
      backend_options.push_back(v);
    } else if (a == "--quick") {
      options.counts = {0, 7, 1023};
    } else {
      return usage(argv[0]);
    }
  }

  shardplan::conformance::Result total;
  std::mutex mu;
  auto run = [&](shardplan::World& world) {
    auto r = shardplan::conformance::run_conformance(world.comm().api(), world.comm().raw(), options);
    std::lock_guard<std::mutex> lock(mu);
    total.passed += r.passed;
    total.failed += r.failed;
    for (auto& f : r.failures) total.failures.push_back(std::move(f));
  };

  try {
    if (threads > 0) {
      std::chrono::milliseconds timeout = timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms)
                                                         : std::chrono::milliseconds(std::chrono::minutes(5));
      shardplan::run_ranks_in_threads(threads, run, backend.empty() ? "local" : backend, backend_options, timeout);
    } else {
      auto opts = shardplan::WorldOptions::from_env();
      if (!backend.empty()) opts.backend = backend;
      if (timeout_ms > 0) opts.timeout = std::chrono::milliseconds(timeout_ms);
      opts.backend_options.insert(opts.backend_options.end(), backend_options.begin(), backend_options.end());
      auto world = shardplan::init_world(opts);
      run(*world);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_conformance: %s\n", e.what());
    ++total.failed;
  }

  for (const auto& f : total.failures) std::printf("FAILED %s\n", f.c_str());
  std::printf("%d passed, %d failed\n", total.passed, total.failed);
  return total.failed == 0 ? 0 : 1;
}
