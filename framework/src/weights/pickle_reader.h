#pragma once
// The part of Python's pickle that torch.save writes for a state dict, read
// without building any tensor: libtorch 1.13's Unpickler (and so
// torch::pickle_load) turns collections.OrderedDict into None, so it cannot
// read model.state_dict() as Python saves it; and it would copy every
// storage. Torch-free; not installed.
#include <cstdint>
#include <string>
#include <vector>

namespace shardplan::weights_detail {

// One tensor of the pickled state dict: where its elements lie in which
// storage record ("data/<key>"), as torch._utils._rebuild_tensor_v2 gets them.
struct PickledTensor {
  std::string name;
  std::string storage_key;
  std::string storage_type;  // "FloatStorage", "BFloat16Storage", ...
  int64_t storage_offset = 0;
  std::vector<int64_t> shape, strides;
};

// The tensors of the dict of tensors `pkl` unpickles to, in order. Throws
// shardplan::Error (naming `file`) for anything else: another object, a
// class other than the state dict's own, opcodes torch.save does not write.
std::vector<PickledTensor> read_pickled_state_dict(const std::string& pkl, const std::string& file);

}  // namespace shardplan::weights_detail
