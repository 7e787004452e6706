#include "rank.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace shardplan_bench {

void* Rank::alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  // Written, so first-touch page faults are not timed.
  std::memset(p, 0, rounded);
  return p;
}
void Rank::release(void* p) { std::free(p); }
void Rank::upload(void* dst, const void* host, size_t bytes) {
  if (dst != host) std::memcpy(dst, host, bytes);
}
void Rank::download(void* host, const void* src, size_t bytes) {
  if (host != src) std::memcpy(host, src, bytes);
}

}  // namespace shardplan_bench
