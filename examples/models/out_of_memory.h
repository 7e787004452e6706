#pragma once
// Out of memory while training, as one line (tests/e2e/llama_bigger_than_rank_train.sh).
// Under a per-process limit (prlimit --data) the allocation that fails is
// libtorch's (c10::Error "DefaultCPUAllocator: can't allocate memory", with a
// backtrace) or the C++ runtime's (std::bad_alloc, no detail at all): neither
// says which part of the training state did not fit, and the part is what
// tells the user what to shard (data_parallel: {zero: 3}, recompute:, more ranks).
#include <string>
#include <utility>

namespace shardplan {
namespace examples {

// If `e` is an allocation failure, throws shardplan::Error "out of memory
// giving WHAT its N bytes: this process holds ... of private memory (its
// limit ...); ..."; otherwise returns.
void throw_if_out_of_memory(const std::string& what, const std::exception& e);

// fn(), whose allocation failures name `what` (above).
template <class F>
decltype(auto) naming_out_of_memory(const std::string& what, F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const std::exception& e) {
    throw_if_out_of_memory(what, e);
    throw;
  }
}

}  // namespace examples
}  // namespace shardplan
