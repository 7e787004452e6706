#pragma once
// How the example programs have glibc keep freed memory.

namespace shardplan {
namespace examples {

// Tensors of a training step are freed and allocated again every step. With
// glibc's defaults a free that leaves more than the trim threshold unused at
// the top of the heap hands it back to the OS, and blocks past the mmap
// threshold get their own mapping; either way the next step faults the same
// pages in again (on the 2-core VM of docs/BENCHMARKS.md, 7x the page faults
// of the same model in Python and 35% fewer tokens/s for train_gpt over gloo;
// the Python interpreter happens to raise glibc's adaptive thresholds while it
// starts). This keeps up to 64 MiB free at the top of the heap and maps only
// blocks of 32 MiB and more, unless the environment already sets glibc's
// malloc tunables (GLIBC_TUNABLES=glibc.malloc.*, MALLOC_*_). A no-op off glibc.
void keep_freed_heap();

}  // namespace examples
}  // namespace shardplan
