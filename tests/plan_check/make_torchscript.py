"""Writes the TorchScript module `shardplan plan auto --torchscript` is tested
on (tests/plan_check/auto_file.sh): OUT/ts_model.pt, torch.jit.script of a
small model with the cases the planner must tell apart:
  - blocks.N: pre-norm residual MLPs, fc1 -> gelu -> fc2 (a pair each);
  - gate, up -> silu(gate) * up -> down (a gated pair);
  - side: its output read by the pair's consumer and by the output (a
    second reader: stays replicated), then proj;
  - emb and head: replicated (no loss module to make them vocab-parallel).
Usage: /usr/bin/python3 make_torchscript.py OUT_DIR; exit 77 when torch is
missing (ctest SKIP_RETURN_CODE)."""
import sys

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, vocab=40, d=16, h=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.gate = nn.Linear(d, 24)
        self.up = nn.Linear(d, 24)
        self.down = nn.Linear(24, d)
        self.side = nn.Linear(d, 8)
        self.proj = nn.Linear(8, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        x = x + self.down(F.silu(self.gate(x)) * self.up(x))
        s = self.side(x)
        x = x + self.proj(torch.relu(s)) + s.sum(-1, keepdim=True)
        return self.head(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(Model()).save(sys.argv[1] + "/ts_model.pt")
