#!/usr/bin/python3
"""Independent PyTorch references of the Llama-like families Hugging Face's
transformers names by config.json's model_type, written from their modeling
code (modeling_llama.py, modeling_qwen2.py, modeling_mistral.py,
modeling_gemma.py) apart from the C++ example (examples/models/llama.cpp):
no cache (every step recomputes the whole sequence), float64 throughout.

  llama    RMSNorm w * x/rms, rotate-half rotary, grouped queries, SwiGLU
  qwen2    llama with q_proj, k_proj and v_proj biases (o_proj none)
  mistral  llama with a sliding window: the query at i attends to keys j
           with i - sliding_window < j <= i (sliding_window null: all)
  gemma    embedding times hidden_size**0.5, RMSNorm x/rms * (1 + w), GeGLU
           with tanh GELU, head_dim from the config, tied embeddings

  reference.py write DIR FAMILY KEY=VALUE...  random weights with the
      family's names into DIR/model.safetensors (F32) and its config.json
  reference.py greedy DIR PROMPT N     the greedy continuation (N bytes) of
      PROMPT, escaped as the C++ example prints it
  reference.py logits DIR PROMPT FILE...  "MAX_ABS_DIFFERENCE FILE" per FILE
      (tensor "logits" [T, V], train_model --dump-logits); exit 1 on a shape
      that is not [T, V]
"""
import json
import math
import os
import sys

import torch

# The rotary embedding, the byte escaping and the greedy and logits commands
# are the Llama reference's (tests/llama/reference.py); what differs by
# family is here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "llama"))
import reference as llama  # noqa: E402
from interop import read_safetensors, write_safetensors  # noqa: E402

BASE = {"vocab_size": 256, "max_position_embeddings": 64, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
FAMILY = {
    "llama": dict(architectures=["LlamaForCausalLM"], hidden_act="silu"),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], hidden_act="silu", use_sliding_window=False,
                  sliding_window=4096, max_window_layers=28),
    "mistral": dict(architectures=["MistralForCausalLM"], hidden_act="silu", sliding_window=8),
    "gemma": dict(architectures=["GemmaForCausalLM"], hidden_act="gelu_pytorch_tanh",
                  hidden_activation="gelu_pytorch_tanh", head_dim=24, tie_word_embeddings=True),
}


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    e, h, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], e], "model.norm.weight": [e]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [e], p + "post_attention_layernorm.weight": [e],
                       p + "self_attn.q_proj.weight": [h * d, e], p + "self_attn.k_proj.weight": [kv * d, e],
                       p + "self_attn.v_proj.weight": [kv * d, e], p + "self_attn.o_proj.weight": [e, h * d],
                       p + "mlp.gate_proj.weight": [c["intermediate_size"], e],
                       p + "mlp.up_proj.weight": [c["intermediate_size"], e],
                       p + "mlp.down_proj.weight": [e, c["intermediate_size"]]})
        if c["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": [h * d], p + "self_attn.k_proj.bias": [kv * d],
                           p + "self_attn.v_proj.bias": [kv * d]})
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [c["vocab_size"], e]
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):  # around 1 (gemma: 1 + w around 1), not exactly: a wrong norm must show
            out[name] = (0 if c["model_type"] == "gemma" else 1) + 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:  # biases: large enough that dropping one changes the text
            out[name] = 0.5 * torch.randn(shape, generator=g)
        else:
            scale = 1 / math.sqrt(shape[1]) if name != "model.embed_tokens.weight" or c["model_type"] != "gemma" \
                else 1 / math.sqrt(shape[1]) / math.sqrt(e)  # gemma multiplies the embedding by sqrt(hidden)
            out[name] = torch.randn(shape, generator=g) * scale
    return out


def rms_norm(x, w, eps, gemma):
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return n * (1 + w) if gemma else n * w  # GemmaRMSNorm stores w for (1 + w)


def mask(c, t):
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if c["model_type"] == "mistral" and c.get("sliding_window") is not None:
        allowed &= j > i - c["sliding_window"]
    return torch.zeros(t, t, dtype=torch.float64).masked_fill(~allowed, float("-inf"))


def proj(W, x, name):
    y = x @ W[name + ".weight"].T
    return y + W[name + ".bias"] if name + ".bias" in W else y


def logits(W, c, tokens):
    e, h, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    t, eps, gemma = len(tokens), c["rms_norm_eps"], c["model_type"] == "gemma"
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    if gemma:
        x = x * torch.tensor(e ** 0.5, dtype=x.dtype)
    m = mask(c, t)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps, gemma)
        q = proj(W, a, p + "self_attn.q_proj").view(t, h, d).transpose(0, 1)
        k = proj(W, a, p + "self_attn.k_proj").view(t, kv, d).transpose(0, 1)
        v = proj(W, a, p + "self_attn.v_proj").view(t, kv, d).transpose(0, 1)
        q, k = llama.rotary(q, c["rope_theta"]), llama.rotary(k, c["rope_theta"])
        k, v = k.repeat_interleave(h // kv, 0), v.repeat_interleave(h // kv, 0)  # HF's repeat_kv
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + m, -1) @ v
        x = x + att.transpose(0, 1).reshape(t, h * d) @ W[p + "self_attn.o_proj.weight"].T
        n = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps, gemma)
        gate = n @ W[p + "mlp.gate_proj.weight"].T
        act = torch.nn.functional.gelu(gate, approximate="tanh") if gemma else gate * torch.sigmoid(gate)
        x = x + (act * (n @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps, gemma)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def write(directory, family, items):
    c = dict(BASE, model_type=family, **FAMILY[family])
    for item in items:
        key, value = item.split("=", 1)
        c[key] = json.loads(value)
    weights = random_weights(c, seed=c.pop("seed", 7))
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), weights)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(c, f, indent=1)


def load(directory):
    """The config (with each family's defaults) and the weights in float64."""
    c = json.load(open(os.path.join(directory, "config.json")))
    c.setdefault("tie_word_embeddings", c["model_type"] == "gemma")
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["model_type"] == "qwen2" and c.get("use_sliding_window"):
        sys.exit("the reference gives qwen2 no sliding window")
    for key, default in (("rope_theta", 10000.0), ("rms_norm_eps", 1e-6)):
        c.setdefault(key, default)
    return c, {n: t.double() for n, t in read_safetensors(os.path.join(directory, "model.safetensors")).items()}


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    if len(sys.argv) >= 4 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        llama.greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]), model=(load, logits))
    elif len(sys.argv) >= 5 and sys.argv[1] == "logits":
        sys.exit(0 if llama.compare_logits(sys.argv[2], sys.argv[3], sys.argv[4:], model=(load, logits)) else 1)
    else:
        sys.exit(__doc__)
