// libFuzzer target: a torch.save file's data.pkl, read by the state-dict
// pickle machine from bytes that may be hostile (deep nesting, cycles
// through the memo, huge lengths). The input is the pickle. Either it is
// refused with shardplan::Error, or it is a dict of tensors whose size and
// stride tuples agree; never a crash, a stack overflow or a leak.
#include <cstddef>
#include <cstdint>
#include <string>

#include "shardplan/error.h"
#include "weights/pickle_reader.h"

namespace wd = shardplan::weights_detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors = wd::read_pickled_state_dict(std::string(reinterpret_cast<const char*>(data), size), "fuzz.bin");
    for (const auto& t : tensors)
      if (t.shape.size() != t.strides.size()) __builtin_trap();
  } catch (const shardplan::Error&) {
  }
  return 0;
}
