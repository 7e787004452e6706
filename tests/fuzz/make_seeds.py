#!/usr/bin/env python3
"""Seeds for the weights readers' fuzz targets, generated rather than checked
in (binary): make_seeds.py OUT writes OUT/<target>/<seed> for
zip_reader_fuzzer, pickle_reader_fuzzer and hf_config_fuzzer."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "weights"))
import torch_like  # noqa: E402

out = sys.argv[1]
tensors = {"fc.weight": (2, 3), "fc.bias": (2,)}


def write(target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


write("zip_reader_fuzzer", "state_dict.bin", torch_like.torch_zip(tensors))
write("zip_reader_fuzzer", "empty.bin", torch_like.torch_zip({}))
write("pickle_reader_fuzzer", "state_dict.pkl", torch_like.state_dict_pickle(tensors))
write("pickle_reader_fuzzer", "empty.pkl", torch_like.state_dict_pickle({}))
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "vocab_size": 256, "max_position_embeddings": 64, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 176, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "rope_scaling": None, "head_dim": 16}
write("hf_config_fuzzer", "config.json", json.dumps(config, indent=2))
# One per family the table reads (hf_config.cpp), with its own keys.
for family, extra in (("qwen2", {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}),
                      ("mistral", {"sliding_window": 8}),
                      ("gemma", {"hidden_activation": "gelu_pytorch_tanh", "head_dim": 24}),
                      ("phi3", {"partial_rotary_factor": 1.0})):
    write("hf_config_fuzzer", family + ".json", json.dumps(dict(config, model_type=family, **extra), indent=2))
write("hf_config_fuzzer", "minimal.json", json.dumps({"hidden_size": 8, "num_attention_heads": 2}))
# Found by hand: head_dim x heads overflowed int64 before the check divided.
write("hf_config_fuzzer", "huge_head_dim.json",
      '{"head_dim": 9223372036854775807, "hidden_size": 1, "num_attention_heads": 2}')
