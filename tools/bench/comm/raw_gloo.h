#pragma once
// gloo used by hand, the way a gloo program would: its own TCP device, a
// context met through gloo's FileStore in a shared directory, gloo's own sum
// kernel, a fresh tag per call. The reference the gloo plugin is measured
// against (here and in benchmarks/comm_gloo).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rank.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace shardplan_bench {

class RawGloo {
 public:
  // `name` keeps several contexts in one directory apart.
  RawGloo(int rank, int size, const std::string& dir, const std::string& name, std::chrono::milliseconds timeout);
  ~RawGloo();
  // false: gloo has no sum for this dtype (bfloat16).
  static bool supports(int32_t dtype);
  // send == recv: in place.
  void all_reduce(const void* send, void* recv, uint64_t count, int32_t dtype);
  void barrier();

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
};

std::unique_ptr<Rank> make_raw_gloo_rank(int rank, int size, const std::string& dir, int32_t dtype,
                                         std::chrono::milliseconds timeout);

}  // namespace shardplan_bench
