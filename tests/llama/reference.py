#!/usr/bin/python3
"""An independent PyTorch Llama (Hugging Face's LlamaForCausalLM: RMSNorm,
rotate-half rotary positions, grouped-query attention, SwiGLU), for
tests/e2e/llama_weights.sh. It shares no code with the C++ example: its own
forward (no cache: every step recomputes the whole sequence), and the
test-only safetensors reader and writer of tests/weights/interop.py.

  reference.py write DIR KEY=VALUE...  random weights with Hugging Face's
      names into DIR/model.safetensors (F32) and DIR/config.json; the same
      rounded to bfloat16 into DIR/bf16/ (with its config.json)
  reference.py greedy DIR PROMPT N     prints the greedy continuation (N bytes)
      of PROMPT under DIR's weights, in float64, escaped as the C++ example
      prints it ("\\xNN" for bytes outside printable ASCII)
  reference.py logits DIR PROMPT FILE...  the float64 logits [T, V] of one
      forward over PROMPT under DIR's weights against each FILE (tensor
      "logits" [T, V] in a safetensors file, as train_model --dump-logits
      writes it): one line per FILE, "MAX_ABS_DIFFERENCE FILE"; exit 1 when a
      FILE's shape is not [T, V]
"""
import json
import math
import os
import sys

import torch

DEFAULTS = {"vocab_size": 256, "max_position_embeddings": 64, "hidden_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 352, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}

# The test-only safetensors code of tests/weights (struct + json, apart from
# the C++ reader and writer).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "weights"))
from interop import read_safetensors, write_safetensors  # noqa: E402


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    e, h, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], None
    d = e // h
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], e], "model.norm.weight": [e]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [e], p + "post_attention_layernorm.weight": [e],
                       p + "self_attn.q_proj.weight": [h * d, e], p + "self_attn.k_proj.weight": [kv * d, e],
                       p + "self_attn.v_proj.weight": [kv * d, e], p + "self_attn.o_proj.weight": [e, h * d],
                       p + "mlp.gate_proj.weight": [c["intermediate_size"], e],
                       p + "mlp.up_proj.weight": [c["intermediate_size"], e],
                       p + "mlp.down_proj.weight": [e, c["intermediate_size"]]})
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [c["vocab_size"], e]
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norms: around 1, not exactly (a wrong norm must show)
            out[name] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, theta):  # x [H, T, D]: pairs (i, i + D/2) rotated by position * theta^(-2i/D)
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rotated * sin


def logits(W, c, tokens):
    e, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d, t, eps = e // h, len(tokens), c["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (a @ W[p + "self_attn.q_proj.weight"].T).view(t, h, d).transpose(0, 1)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).view(t, kv, d).transpose(0, 1)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).view(t, kv, d).transpose(0, 1)
        q, k = rotary(q, c["rope_theta"]), rotary(k, c["rope_theta"])
        k, v = k.repeat_interleave(h // kv, 0), v.repeat_interleave(h // kv, 0)  # query head j reads kv head j // (h/kv)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + mask, -1) @ v
        x = x + att.transpose(0, 1).reshape(t, h * d) @ W[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate = m @ W[p + "mlp.gate_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (m @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def printable(data):
    out = ""
    for b in data:
        if b == 10:
            out += "\\n"
        elif b == 92:
            out += "\\\\"
        elif b < 0x20 or b >= 0x7F:
            out += "\\x%02x" % b
        else:
            out += chr(b)
    return out


def write(directory, items):
    c = dict(DEFAULTS)
    for item in items:
        key, value = item.split("=", 1)
        c[key] = json.loads(value)
    weights = random_weights(c, seed=c.pop("seed", 7))
    for sub, dtype in (("", torch.float32), ("bf16", torch.bfloat16)):
        path = os.path.join(directory, sub)
        os.makedirs(path, exist_ok=True)
        write_safetensors(os.path.join(path, "model.safetensors"), {n: t.to(dtype) for n, t in weights.items()})
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(dict(c, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu"), f)


def load(directory):
    """The config and the weights in float64 (exactly the file's values)."""
    c = dict(DEFAULTS)
    c.update(json.load(open(os.path.join(directory, "config.json"))))
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    return c, {n: t.double() for n, t in read_safetensors(os.path.join(directory, "model.safetensors")).items()}


def greedy(directory, prompt, n, model=None):
    """model: (load, logits) of another reference (tests/families/reference.py); default this one's."""
    load_fn, logits_fn = model or (load, logits)
    c, W = load_fn(directory)
    tokens = list(prompt.encode())
    for _ in range(n):
        tokens.append(int(logits_fn(W, c, tokens)[-1].argmax()))
    print(printable(prompt.encode()) + "|" + printable(tokens[len(prompt.encode()):]))


def compare_logits(directory, prompt, files, model=None):
    load_fn, logits_fn = model or (load, logits)
    c, W = load_fn(directory)
    want = logits_fn(W, c, list(prompt.encode()))
    ok = True
    for path in files:
        got = read_safetensors(path)["logits"]
        if list(got.shape) != list(want.shape):
            print(f"{path}: logits of shape {list(got.shape)}, expected {list(want.shape)}")
            ok = False
            continue
        print("%.3e %s" % (float((got.double() - want).abs().max()), path))
    return ok


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "logits":
        sys.exit(0 if compare_logits(sys.argv[2], sys.argv[3], sys.argv[4:]) else 1)
    else:
        sys.exit(__doc__)
