#!/usr/bin/python3
"""An independent PyTorch GPT-2 (Hugging Face's GPT2LMHeadModel: learned
positions, pre-LayerNorm blocks, Conv1D projections y = x @ W + b with W
stored [in, out], q/k/v fused in c_attn, gelu_new, lm_head tied to wte), for
tests/e2e/gpt2_logits.sh. It shares no code with the C++ example: its own
float64 forward (no cache: every step recomputes the whole sequence), and
the test-only safetensors reader and writer of tests/weights/interop.py.

  reference.py write DIR KEY=VALUE...  random weights in GPT-2's layout into
      DIR/model.safetensors (F32) and DIR/config.json. Keys are GPT2Config's,
      plus prefix=1 (names from "transformer.", as GPT2LMHeadModel saves;
      default: from "h.", "wte." as the original checkpoints), buffers=1 (the
      attn.bias / attn.masked_bias buffers older files carry) and
      unfused=1 (c_attn.weight stored [3E, E], not Conv1D's [E, 3E]: a bad file)
  reference.py greedy DIR PROMPT N     the greedy continuation (N bytes) of
      PROMPT, in float64, escaped as the C++ example prints it
  reference.py logits DIR PROMPT FILE...  one line per FILE (tensor "logits"
      [T, V], as train_model --dump-logits writes it): "MAX_ABS_DIFF FILE"
  reference.py same DIR1 DIR2          the largest difference between the two
      directories' weights (tensor by tensor; names and shapes must agree)
  reference.py batch PROMPT N ITEM...  all of the above in one process (torch
      takes seconds to import), one output line per ITEM: write:DIR[:KEY=VALUE
      ...] (prints "wrote DIR"), greedy:DIR, logits:DIR:FILE, same:DIR1:DIR2
"""
import json
import math
import os
import sys

import torch

DEFAULTS = {"vocab_size": 256, "n_positions": 64, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": None,
            "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "scale_attn_weights": True,
            "tie_word_embeddings": True}

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "weights"))
from interop import read_safetensors, write_safetensors  # noqa: E402


def inner(c):
    return c["n_inner"] if c.get("n_inner") is not None else 4 * c["n_embd"]


def shapes(c):
    """GPT-2's tensors as the files hold them: Conv1D weights [in, out]."""
    e, m = c["n_embd"], inner(c)
    out = {"wte.weight": [c["vocab_size"], e], "wpe.weight": [c["n_positions"], e],
           "ln_f.weight": [e], "ln_f.bias": [e]}
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": [e], p + "ln_1.bias": [e], p + "ln_2.weight": [e], p + "ln_2.bias": [e],
                    p + "attn.c_attn.weight": [e, 3 * e], p + "attn.c_attn.bias": [3 * e],
                    p + "attn.c_proj.weight": [e, e], p + "attn.c_proj.bias": [e],
                    p + "mlp.c_fc.weight": [e, m], p + "mlp.c_fc.bias": [m],
                    p + "mlp.c_proj.weight": [m, e], p + "mlp.c_proj.bias": [e]})
    return out


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes(c).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            out[name] = 1 + 0.1 * torch.randn(shape, generator=g)  # around 1: a wrong norm must show
        elif len(shape) == 1:
            out[name] = 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(shape[0] if "wte" not in name else shape[1])
    return out


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def logits(W, c, tokens):
    e, h = c["n_embd"], c["n_head"]
    d, t, eps = e // h, len(tokens), c["layer_norm_epsilon"]
    x = W["wte.weight"][torch.tensor(tokens)] + W["wpe.weight"][:t]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: [t, 3E]
        q, k, v = (z.view(t, h, d).transpose(0, 1) for z in qkv.split(e, -1))
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + mask, -1) @ v
        x = x + att.transpose(0, 1).reshape(t, e) @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        f = gelu_new(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + f @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = layer_norm(x, W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte.weight"].T  # lm_head tied


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
    prefix, buffers, unfused = c.pop("prefix", 0), c.pop("buffers", 0), c.pop("unfused", 0)
    weights = random_weights(c, seed=c.pop("seed", 7))
    if unfused:
        for name in list(weights):
            if name.endswith("attn.c_attn.weight"):
                weights[name] = weights[name].T.contiguous()
    if buffers:
        n = c["n_positions"]
        for i in range(c["n_layer"]):
            weights[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.uint8)).view(1, 1, n, n)
            weights[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    os.makedirs(directory, exist_ok=True)
    named = {("transformer." if prefix else "") + n: (t.float() if t.is_floating_point() else t)
             for n, t in weights.items()}
    write_safetensors(os.path.join(directory, "model.safetensors"), named)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(c, architectures=["GPT2LMHeadModel"], model_type="gpt2"), f)


def load(directory):
    """The config and the weights in float64 (exactly the file's values),
    named from "h." whatever the file's prefix; buffers and lm_head dropped.
    Every tensor must have GPT-2's shape (Conv1D: [in, out])."""
    c = dict(DEFAULTS)
    c.update(json.load(open(os.path.join(directory, "config.json"))))
    assert c["activation_function"] == "gelu_new" and c["tie_word_embeddings"] and c["scale_attn_weights"], c
    W = {}
    for n, t in read_safetensors(os.path.join(directory, "model.safetensors")).items():
        n = n[len("transformer."):] if n.startswith("transformer.") else n
        if n.endswith(".attn.bias") or n.endswith(".attn.masked_bias") or n == "lm_head.weight":
            continue
        W[n] = t.double()
    want = shapes(c)
    got = {n: list(t.shape) for n, t in W.items()}
    if got != want:
        wrong = {n: s for n, s in got.items() if want.get(n) != s}
        sys.exit(f"{directory}: not GPT-2's tensors (Conv1D [in, out]): {wrong or sorted(set(want) - set(got))}")
    return c, W


def greedy(directory, prompt, n):
    c, W = load(directory)
    tokens = list(prompt.encode())
    for _ in range(n):
        tokens.append(int(logits(W, c, tokens)[-1].argmax()))
    print(printable(prompt.encode()) + "|" + printable(tokens[len(prompt.encode()):]))


def compare_logits(directory, prompt, files):
    c, W = load(directory)
    want = logits(W, c, list(prompt.encode()))
    ok = True
    for path in files:
        got = read_safetensors(path)["logits"]
        if list(got.shape) != list(want.shape):
            print(f"{path}: logits of shape {list(got.shape)}, expected {list(want.shape)}")
            ok = False
            continue
        print("%.3e %s" % (float((got.double() - want).abs().max()), path))
    return ok


def same(d1, d2):
    (_, w1), (_, w2) = load(d1), load(d2)
    assert sorted(w1) == sorted(w2), (sorted(w1), sorted(w2))
    print("%.3e" % max(float((w1[n] - w2[n]).abs().max()) for n in w1))


def batch(prompt, n, items):
    for item in items:
        what, _, rest = item.partition(":")
        if what == "write":
            parts = rest.split(":")
            write(parts[0], parts[1:])
            print("wrote " + parts[0])
        elif what == "greedy":
            greedy(rest, prompt, n)
        elif what == "logits":
            directory, _, path = rest.partition(":")
            if not compare_logits(directory, prompt, [path]):
                sys.exit(1)
        elif what == "same":
            same(*rest.split(":", 1))
        else:
            sys.exit(f"batch: unknown item {item!r}")
        sys.stdout.flush()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "logits":
        sys.exit(0 if compare_logits(sys.argv[2], sys.argv[3], sys.argv[4:]) else 1)
    elif len(sys.argv) >= 4 and sys.argv[1] == "batch":
        batch(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
