#!/usr/bin/env python3
"""Exports a GPT-style byte-level language model as TorchScript, for
examples/train_script.cpp (docs/TORCHSCRIPT.md).

  export_script_gpt.py OUT.pt [--double] [--embed E] [--heads H] [--context T] [--layers L]

The sizes default to the model below (embed 64, 4 heads, context 32, 2
layers; the MLP is 4 x embed wide); benchmarks/script sets them.

Pre-LN blocks with separate q/k/v projections; the head count is the
attribute `n_head`, which the plan's `divide:` halves at 2 ranks
(examples/script_gpt.yaml). Exit 77 when torch is missing.
"""
import math
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

VOCAB, EMBED, HEADS, CONTEXT, LAYERS = 256, 64, 4, 32, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head = HEADS
        self.head_dim = EMBED // HEADS
        self.q = nn.Linear(EMBED, EMBED)
        self.k = nn.Linear(EMBED, EMBED)
        self.v = nn.Linear(EMBED, EMBED)
        self.proj = nn.Linear(EMBED, EMBED)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)))

    def heads(self, t, B: int, T: int):
        return t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.size()
        q, k, v = self.heads(self.q(x), B, T), self.heads(self.k(x), B, T), self.heads(self.v(x), B, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.n_head * self.head_dim)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(EMBED)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(EMBED)
        self.fc1 = nn.Linear(EMBED, 4 * EMBED)
        self.fc2 = nn.Linear(4 * EMBED, EMBED)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.context = CONTEXT
        self.tok_emb = nn.Embedding(VOCAB, EMBED)
        self.pos_emb = nn.Parameter(torch.randn(CONTEXT, EMBED) * 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(EMBED)
        self.head = nn.Linear(EMBED, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb[: idx.size(1)]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def set_sizes(argv):
    """Overrides the module-level sizes from --embed/--heads/--context/--layers."""
    global EMBED, HEADS, CONTEXT, LAYERS
    sizes = {"--embed": EMBED, "--heads": HEADS, "--context": CONTEXT, "--layers": LAYERS}
    for i, arg in enumerate(argv):
        if arg in sizes:
            if i + 1 >= len(argv) or not argv[i + 1].isdigit() or int(argv[i + 1]) < 1:
                sys.exit("%s takes a positive integer" % arg)
            sizes[arg] = int(argv[i + 1])
    EMBED, HEADS, CONTEXT, LAYERS = sizes["--embed"], sizes["--heads"], sizes["--context"], sizes["--layers"]
    if EMBED % HEADS:
        sys.exit("--embed %d is not divisible by --heads %d" % (EMBED, HEADS))


def export(make_model, argv, usage):
    """The command line every export_script_*.py takes: OUT.pt [--double],
    the model made from seed 0 (examples/export_script_llama.py uses it)."""
    if len(argv) < 2:
        sys.exit(usage)
    torch.manual_seed(0)
    model = make_model()
    if "--double" in argv:
        model = model.double()
    torch.jit.script(model).save(argv[1])


if __name__ == "__main__":
    set_sizes(sys.argv)
    export(GPT, sys.argv, __doc__)
