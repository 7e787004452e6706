#!/usr/bin/python3
"""An independent PyTorch Phi-3 (Hugging Face's Phi3ForCausalLM, as
modeling_phi3 computes it: RMSNorm, one qkv_proj whose output is cut into
queries, keys and values, rotate-half rotary positions, grouped-query
attention, one gate_up_proj whose output is chunked in two, silu on the
first half), for tests/e2e/phi3.sh. Its weights are the fused tensors
Phi-3's checkpoints hold; it shares no code with the C++ example (the
norm, rotary and printing helpers of tests/llama/reference.py, and the
test-only safetensors code of tests/weights/interop.py).

  reference.py write DIR KEY=VALUE...  random weights with Phi-3's names
      (qkv_proj, gate_up_proj) into DIR/model.safetensors (F32) and
      DIR/config.json (model_type phi3)
  reference.py greedy DIR PROMPT N     the greedy continuation, printed as
      tests/llama/reference.py prints it
  reference.py logits DIR PROMPT FILE...  "MAX_ABS_DIFFERENCE FILE" per FILE
      against the float64 logits of one forward over PROMPT
"""
import json
import math
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "llama"))
sys.path.insert(0, os.path.join(here, "..", "weights"))
from interop import read_safetensors, write_safetensors  # noqa: E402
import reference as llama  # noqa: E402
from reference import rms_norm, rotary  # noqa: E402

DEFAULTS = {"vocab_size": 256, "max_position_embeddings": 64, "original_max_position_embeddings": 64,
            "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "intermediate_size": 24, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "rope_scaling": None, "sliding_window": None, "hidden_act": "silu", "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attention_dropout": 0.0}


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    e, h, kv, m = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    d = e // h
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], e], "model.norm.weight": [e]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [e], p + "post_attention_layernorm.weight": [e],
                       p + "self_attn.qkv_proj.weight": [(h + 2 * kv) * d, e],
                       p + "self_attn.o_proj.weight": [e, h * d],
                       p + "mlp.gate_up_proj.weight": [2 * m, e], p + "mlp.down_proj.weight": [e, m]})
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [c["vocab_size"], e]
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
    return out


def logits(W, c, tokens):
    e, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d, t, eps = e // h, len(tokens), c["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        qkv = a @ W[p + "self_attn.qkv_proj.weight"].T  # Phi3Attention: one projection, cut by position
        query_pos = h * d
        q = qkv[..., :query_pos].view(t, h, d).transpose(0, 1)
        k = qkv[..., query_pos:query_pos + kv * d].view(t, kv, d).transpose(0, 1)
        v = qkv[..., query_pos + kv * d:].view(t, kv, d).transpose(0, 1)
        q, k = rotary(q, c["rope_theta"]), rotary(k, c["rope_theta"])
        k, v = k.repeat_interleave(h // kv, 0), v.repeat_interleave(h // kv, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + mask, -1) @ v
        x = x + att.transpose(0, 1).reshape(t, h * d) @ W[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate, up = (m @ W[p + "mlp.gate_up_proj.weight"].T).chunk(2, dim=-1)  # Phi3MLP
        x = x + (up * (gate * torch.sigmoid(gate))) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def write(directory, items):
    c = dict(DEFAULTS)
    for item in items:
        key, value = item.split("=", 1)
        c[key] = json.loads(value)
    weights = random_weights(c, seed=c.pop("seed", 7))
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), {n: t.float() for n, t in weights.items()})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(c, architectures=["Phi3ForCausalLM"], model_type="phi3"), f)


def load(directory):
    c = dict(DEFAULTS)
    c.update(json.load(open(os.path.join(directory, "config.json"))))
    assert c["model_type"] == "phi3", c["model_type"]
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    W = {n: t.double() for n, t in read_safetensors(os.path.join(directory, "model.safetensors")).items()}
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in W), "not Phi-3's fused names"
    return c, W


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    # The Llama reference's greedy and logits drivers, over this model.
    llama.load, llama.logits = load, logits
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        llama.greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "logits":
        sys.exit(0 if llama.compare_logits(sys.argv[2], sys.argv[3], sys.argv[4:]) else 1)
    else:
        sys.exit(__doc__)
