#!/usr/bin/env python3
"""Scripts and saves the TorchScript models tests/test_script.cpp shards.

  make_models.py OUT_DIR      writes OUT_DIR/*.pt; exit 77 when torch is missing

Float64 throughout, so the C++ test can hold the sharded modules to 1e-10.
Each model keeps the parts a rewrite must get right distinct: a hidden width
that differs from the input's, head counts read as attributes, a bias on
every linear that has one in real models.
"""
import copy
import math
import os
import sys
from collections import OrderedDict

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

V, E, H, T = 48, 24, 4, 6   # vocabulary, embedding, heads (head_dim 6), context


class MLP(nn.Module):
    """fc1 column (sharded) -> fc2 row (input sharded) -> fc3 column (gathered),
    inside an `if`, -> fc4 row (input replicated: scattered on entry)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 12)
        self.fc3 = nn.Linear(12, 16)
        self.fc4 = nn.Linear(16, 8)
        self.use_fc3 = True

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(x)))
        if self.use_fc3:
            h = torch.tanh(self.fc3(h))
        return self.fc4(h)


class Attention(nn.Module):
    """Separate q, k, v projections (fused=False) or one qkv (a `blocks: 3` rule)."""

    def __init__(self, fused):
        super().__init__()
        self.n_head = H
        self.head_dim = E // H
        self.n_embd = E          # never read by forward: a divide of it is refused
        self.proj = nn.Linear(E, E)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def heads(self, t, B: int, T_: int):
        return t.view(B, T_, self.n_head, self.head_dim).transpose(1, 2)

    def merge(self, y, B: int, T_: int):
        return y.transpose(1, 2).contiguous().view(B, T_, self.n_head * self.head_dim)

    def attend(self, q, k, v):
        B, T_, _ = q.size()
        q, k, v = self.heads(q, B, T_), self.heads(k, B, T_), self.heads(v, B, T_)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.mask[:T_, :T_] == 0, float("-inf")).softmax(-1)
        return self.proj(self.merge(att @ v, B, T_))


class AttnSep(Attention):
    def __init__(self):
        super().__init__(False)
        self.q = nn.Linear(E, E)
        self.k = nn.Linear(E, E)
        self.v = nn.Linear(E, E)

    def forward(self, x):
        return self.attend(self.q(x), self.k(x), self.v(x))


class AttnFused(Attention):
    def __init__(self):
        super().__init__(True)
        self.qkv = nn.Linear(E, 3 * E)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.attend(q, k, v)


class HeadsByDim:
    """Traced, the head count follows from the width (-1) and head_dim is a
    constant that sharding keeps: the sharded module stays right."""

    def heads(self, t, B: int, T_: int):
        return t.view(B, T_, -1, self.head_dim).transpose(1, 2)

    def merge(self, y, B: int, T_: int):
        return y.transpose(1, 2).contiguous().view(B, T_, -1)


class HeadsByCount(HeadsByDim):
    """Traced, the head count is baked in (4) and head_dim follows (-1): a
    rank's 2 heads of 6 become 4 of 3, which runs and is wrong."""

    def heads(self, t, B: int, T_: int):
        return t.view(B, T_, self.n_head, -1).transpose(1, 2)


def attention(fused, heads):
    base = AttnFused if fused else AttnSep
    return base() if heads is None else type(heads.__name__ + base.__name__, (heads, base), {})()


class Block(nn.Module):
    def __init__(self, fused, heads=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(E)
        self.attn = attention(fused, heads)
        self.ln2 = nn.LayerNorm(E)
        self.fc1 = nn.Linear(E, 4 * E)
        self.fc2 = nn.Linear(4 * E, E)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, heads=None):
        super().__init__()
        self.tok_emb = nn.Embedding(V, E)
        self.pos_emb = nn.Parameter(torch.randn(T, E) * 0.1)
        self.blocks = nn.ModuleList([Block(False, heads), Block(True, heads)])
        self.ln_f = nn.LayerNorm(E)
        self.head = nn.Linear(E, V, bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb[: idx.size(1)]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.ln = nn.LayerNorm(E)
        self.head = nn.Linear(E, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.ln(self.emb(idx)))


class MatmulMLP(nn.Module):
    """The MLP's linears written out: column x @ W.t() + b (output sharded),
    row addmm (input sharded), column addmm (gathered), row x @ W.t() + b
    (input replicated)."""

    def __init__(self):
        super().__init__()
        for i, (n, m) in enumerate(((12, 32), (32, 12), (12, 16), (16, 8)), 1):
            lin = nn.Linear(n, m)
            setattr(self, "w%d" % i, lin.weight)
            setattr(self, "b%d" % i, lin.bias)

    def forward(self, x):
        h = F.gelu(x @ self.w1.t() + self.b1)
        h = torch.addmm(self.b2, h, self.w2.t())
        h = torch.tanh(torch.addmm(self.b3, h, self.w3.t()))
        return torch.matmul(h, self.w4.t()) + self.b4


class ScaledMLP(nn.Module):
    """A per-feature scale between a column and a row linear: its read,
    aten::mul, has no built-in rewrite (a test registers one)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.scale = nn.Parameter(torch.rand(32) + 0.5)
        self.fc2 = nn.Linear(32, 12)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)) * self.scale)


class LossLM(GPT):
    """GPT whose forward takes the targets and returns the loss: the LM
    head's logits (vocab-split when planned `output: sharded`) reach
    F.cross_entropy as (-1, vocab) through view(-1, logits.size(-1))."""

    def forward(self, idx, targets):
        x = self.tok_emb(idx) + self.pos_emb[: idx.size(1)]
        for blk in self.blocks:
            x = blk(x)
        return self.loss(self.head(self.ln_f(x)), targets)

    def loss(self, logits, targets):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LossLMSmooth(LossLM):
    """Through view(B * T, C) of `B, T, C = logits.size()`, ignoring class 0,
    label smoothing 0.1."""

    def loss(self, logits, targets):
        B, T_, C = logits.size()
        return F.cross_entropy(logits.view(B * T_, C), targets.view(-1), ignore_index=0, label_smoothing=0.1)


class LossLMWeighted(LossLM):
    """Class weights (a buffer of the full vocabulary), through flatten(0, -2)
    and contiguous."""

    def __init__(self):
        super().__init__()
        self.register_buffer("class_weight", torch.rand(V, dtype=torch.float64) + 0.5)

    def loss(self, logits, targets):
        return F.cross_entropy(logits.flatten(0, -2).contiguous(), targets.view(-1), weight=self.class_weight)


class LossLMTransposed(LossLM):
    """The logits reach the loss through a transpose (classes on dim 1, as
    torch reads them): the rewrite cannot follow that, and refuses."""

    def loss(self, logits, targets):
        return F.cross_entropy(logits.transpose(1, 2), targets)


# A Llama-family decoder with Hugging Face's parameter names
# (model.layers.N.self_attn.q_proj.weight, ...): RMSNorm, rotary positions
# from cos/sin buffers, grouped-query attention (8 query heads share 4
# key/value heads: both counts are attributes a plan divides, and each rank
# must keep the query heads of its key/value heads) and a SwiGLU MLP. No
# biases, as in Llama. head_dim 4: rotary positions rotate pairs.
LV, LH, LKV, LD, LI, LT = 48, 8, 4, 4, 32, 16   # vocab, heads, kv heads, head_dim, MLP width, positions


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))   # not ones: its gradient checks more
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = LH, LKV, LD
        self.q_proj = nn.Linear(LH * LD, LH * LD, bias=False)
        self.k_proj = nn.Linear(LH * LD, LKV * LD, bias=False)
        self.v_proj = nn.Linear(LH * LD, LKV * LD, bias=False)
        self.o_proj = nn.Linear(LH * LD, LH * LD, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, LD, 2, dtype=torch.float64) / LD))
        freqs = torch.outer(torch.arange(LT, dtype=torch.float64), inv_freq)
        self.register_buffer("cos_cached", torch.cat((freqs, freqs), -1).cos())
        self.register_buffer("sin_cached", torch.cat((freqs, freqs), -1).sin())
        self.register_buffer("mask", torch.tril(torch.ones(LT, LT)))

    def split(self, t, B: int, T: int, heads: int):
        return t.view(B, T, heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.size()
        q = self.split(self.q_proj(x), B, T, self.num_heads)
        k = self.split(self.k_proj(x), B, T, self.num_key_value_heads)
        v = self.split(self.v_proj(x), B, T, self.num_key_value_heads)
        cos, sin = self.cos_cached[:T], self.sin_cached[:T]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # Query head h reads key/value head h // n_rep (Hugging Face's repeat_kv).
        n_rep = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(LH * LD, LI, bias=False)
        self.up_proj = nn.Linear(LH * LD, LI, bias=False)
        self.down_proj = nn.Linear(LI, LH * LD, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(LH * LD)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(LH * LD)
        self.mlp = LlamaMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(LV, LH * LD)
        self.layers = nn.ModuleList([LlamaDecoderLayer() for _ in range(2)])
        self.norm = LlamaRMSNorm(LH * LD)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = LlamaModel()
        self.lm_head = nn.Linear(LH * LD, LV, bias=False)

    def forward(self, idx):
        return self.lm_head(self.model(idx))


class TwoMethods(nn.Module):
    """A second exported method that reads a planned parameter: it is
    rewritten when named (ScriptOptions::methods), refused when not."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))

    @torch.jit.export
    def hidden(self, x):
        return F.relu(self.fc1(x))


class RNNNet(nn.Module):
    """An RNN the plan leaves replicated between planned linears: its
    forward reads the weights through the `_flat_weights` list, not the
    parameter slots, so the sharded module must keep them one tensor."""

    def __init__(self, kind):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 12)
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}[kind]
        self.rnn = rnn(12, 10, num_layers=2, batch_first=True, bidirectional=kind == "gru")
        self.fc3 = nn.Linear(20 if kind == "gru" else 10, 16)
        self.fc4 = nn.Linear(16, 8)

    def forward(self, x):
        h = self.fc2(torch.tanh(self.fc1(x)))
        y, _ = self.rnn(h)
        return self.fc4(torch.tanh(self.fc3(y)))


class CachedWeight(nn.Module):
    """A planned weight also held by a list attribute the forward reads: the
    list cannot be cut, so the plan is refused."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 8)
        self.cache = [self.fc1.weight]

    def forward(self, x):
        return self.fc2(F.linear(x, self.cache[0]) + self.fc1(x))


class DividedMLP(nn.Module):
    """A per-feature divisor between a column and a row linear (aten::div,
    no built-in rewrite: a test registers one)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.gate = nn.Parameter(torch.rand(32) + 0.5)
        self.fc2 = nn.Linear(32, 12)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)) / self.gate)


class Einsum(nn.Module):
    """A planned weight read by torch.einsum, which no rewrite handles."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 12))
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(torch.einsum("bi,oi->bo", x, self.w))


class HeadSized(nn.Module):
    """An attention that exposes its head size (head_dim 6, 4 heads of it)."""

    def __init__(self):
        super().__init__()
        self.n_head = 4
        self.head_dim = 6
        self.qkv = nn.Linear(24, 72)
        self.proj = nn.Linear(24, 24)

    def forward(self, x):
        B, T_, _ = x.size()
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(B, T_, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T_, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T_, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T_, self.n_head * self.head_dim))


def perturb_norms(model):
    # LayerNorms start at ones/zeros; perturbed, their gradients check more.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".ln" in "." + n:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_rnn_training(m, path):
    """PyTorch's own training of an RNN net, for tests/test_script_rnn.cpp to
    match sharded: a list of the three inputs, the gradients of step 1 and the
    parameters after three Adam steps, in the module's parameter order. The
    loss is script_test_util.h's loss_of; a generator of its own leaves the
    other models' draws as they were."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(3, 5, 12, dtype=torch.float64, generator=g) for _ in range(3)]
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, eps=1e-6)
    grads = None
    for x in xs:
        opt.zero_grad()
        y = m(x)
        w = torch.sin(torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape) * 0.37) + 0.5
        (torch.tanh(y) * w).sum().backward()
        if grads is None:
            grads = [p.grad.detach().clone() for p in m.parameters()]
        opt.step()
    torch.save(xs + grads + [p.detach().clone() for p in m.parameters()], path)


def main(out):
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    save = lambda m, name: torch.jit.script(m).save(os.path.join(out, name))
    mlp = MLP().double()
    save(mlp, "mlp.pt")
    torch.jit.freeze(torch.jit.script(mlp).eval()).save(os.path.join(out, "mlp_frozen.pt"))
    gpt = perturb_norms(GPT().double())
    save(gpt, "gpt.pt")
    # Traced twins: no attributes are kept and shapes are constants.
    ids = torch.randint(V, (2, T))
    for heads, name in ((HeadsByDim, "gpt_traced.pt"), (HeadsByCount, "gpt_traced_baked.pt")):
        torch.jit.trace(perturb_norms(GPT(heads).double()), ids).save(os.path.join(out, name))
    tied = perturb_norms(Tied().double())
    save(tied, "tied.pt")
    save(MatmulMLP().double(), "matmul_mlp.pt")
    save(ScaledMLP().double(), "scaled_mlp.pt")
    # The loss in the graph (test_script_loss.cpp); before the
    # constants below, which would inline their head counts.
    for cls, name in ((LossLM, "lm_loss.pt"), (LossLMSmooth, "lm_loss_smooth.pt"),
                      (LossLMWeighted, "lm_loss_weighted.pt"), (LossLMTransposed, "lm_loss_transposed.pt")):
        save(perturb_norms(cls().double()), name)
    # Llama (tests/test_script_llama.cpp), and Python's own output on a probe
    # (a tuple: ids, logits) for the C++ runs to match.
    llama = LlamaForCausalLM().double()
    save(llama, "llama.pt")
    probe = torch.randint(LV, (3, 6))
    with torch.no_grad():
        torch.save((probe, llama(probe)), os.path.join(out, "llama_io.pt"))
        # The same for the models tests/test_script.cpp shards.
        for m, x, name in ((mlp, torch.randn(5, 12, dtype=torch.float64), "mlp_io.pt"),
                           (gpt, torch.randint(V, (3, T)), "gpt_io.pt"), (tied, torch.randint(V, (3, T)), "tied_io.pt")):
            torch.save((x, m(x)), os.path.join(out, name))
    save(TwoMethods().double(), "two_methods.pt")
    rnns = {kind: RNNNet(kind).double() for kind in ("gru", "lstm", "rnn")}
    for kind, m in rnns.items():
        save(m, kind + "_net.pt")
    save(CachedWeight().double(), "cached_weight.pt")
    save(Einsum().double(), "einsum.pt")
    save(DividedMLP().double(), "divided_mlp.pt")
    save(nn.Sequential(OrderedDict(attn=HeadSized())).double(), "head_sized.pt")
    torch.save({"w": torch.zeros(2)}, os.path.join(out, "state_dict.pt"))   # not a TorchScript module
    for cls in (AttnSep, AttnFused):   # head count inlined into the graph
        cls.__constants__ = ["n_head", "head_dim"]
    save(gpt, "gpt_const.pt")
    for kind, m in rnns.items():
        save_rnn_training(copy.deepcopy(m), os.path.join(out, kind + "_train.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
