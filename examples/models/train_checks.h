#pragma once
// Checks the training driver (train_loop.cpp) makes before step 1 for what
// would otherwise fail only after training: where --save writes, and whether
// what --generate allocates fits this machine. Torch-free.
#include <cstdint>
#include <string>

namespace shardplan {
namespace examples {

// Throws shardplan::Error naming `option` (--save, --save-weights) when
// `dir` could not be written: a checkpoint goes to DIR.partial beside it and
// is then renamed to DIR, so the parent must be a writable directory and
// DIR, if it exists, one too (a path ending in .safetensors is a file).
void check_save_dir(const std::string& dir, const std::string& option);

// Bytes this machine can still hand out: /proc/meminfo's MemAvailable, else
// sysconf's available pages; -1 when neither says. `source` names which.
int64_t available_memory_bytes(std::string* source);

// Throws shardplan::Error naming `option` when `ranks` ranks of this machine
// needing `per_rank` bytes each (as a double: the product of a large option
// must not wrap) exceed what is available.
void check_memory(const std::string& option, const std::string& what, double per_rank, int ranks);

}  // namespace examples
}  // namespace shardplan
