#include "models/heap.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace shardplan {
namespace examples {

void keep_freed_heap() {
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return;
  for (const char* v : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(v)) return;
  // Setting either threshold also stops glibc from adapting the other.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace examples
}  // namespace shardplan
