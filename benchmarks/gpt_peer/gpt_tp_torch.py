#!/usr/bin/python3
"""The Python reference for shardplan's GPT example over gloo.

The same GPT as examples/models/gpt.h (same defaults as train_gpt), tensor-
parallel by hand the way Megatron-LM does it, communicating through
torch.distributed with PyTorch's own gloo process group (ProcessGroupGloo).
The plan is plans/gpt.yaml's: a vocab-parallel token embedding, head-parallel
attention with a row-parallel output projection, a column/row-parallel MLP,
and a column-parallel LM head feeding a vocab-parallel cross-entropy. So both
programs move the same bytes in the same calls per step (each prints them).

The full model is built first, from torch.manual_seed(seed) with the modules
created in the order gpt.cpp creates them, and then sliced, so the initial
weights are the C++ example's; the data stream is drawn the same way from the
same corpus. The losses therefore agree with train_gpt's to rounding.

Started like train_gpt, by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT (torchrun's variables):

  shardplan launch -n 2 --master-port 29611 -- \\
      /usr/bin/python3 benchmarks/gpt_peer/gpt_tp_torch.py --threads 1

Without them it runs one unsharded rank. It prints train_gpt's lines (model,
bytes communicated, `step N  loss L  mean M  tokens/s R`), which is what
benchmarks/gpt_peer/side_by_side.py compares. Needs Debian's python3-torch.
"""

import argparse
import math
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError:  # the caller decides whether that is fatal
    print("gpt_tp_torch.py: python3-torch is not installed (apt-get install python3-torch)", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import timeline  # noqa: E402  (SHARDPLAN_COMM_TRACE=DIR: the per-call trace; the plain calls otherwise)

DEFAULT_DATA = os.path.join(HERE, "..", "..", "examples", "data", "sonnets.txt")


class Stats:
    """Bytes and calls this rank communicated, like shardplan's CommStats."""

    bytes = 0
    calls = 0


def all_reduce(t, op=None):
    Stats.bytes += t.numel() * t.element_size()
    Stats.calls += 1
    return timeline.traced_all_reduce(t, dist.ReduceOp.SUM if op is None else op, "model")


# Megatron's conjugate pairs (megatron/core/tensor_parallel/mappings.py).
class CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous())


class ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx, g):
        return g


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over logits split along the vocabulary: the row max,
    the sum of exponentials and the target logit are all-reduced ([N] each);
    the [N, V] logits never exist on one rank."""

    @staticmethod
    def forward(ctx, logits, target, rank, world):
        local = logits.size(-1)
        lo = local * rank
        m = logits.max(dim=-1, keepdim=True)[0].contiguous()
        all_reduce(m, dist.ReduceOp.MAX)
        shifted = logits - m
        e = shifted.exp()
        s = e.sum(dim=-1, keepdim=True).contiguous()
        all_reduce(s)
        logp = shifted - s.log()
        t = target.unsqueeze(-1)
        mine = (t >= lo) & (t < lo + local)
        idx = (t - lo).masked_fill(~mine, 0)
        logp_t = logp.gather(-1, idx).masked_fill(~mine, 0).contiguous()
        all_reduce(logp_t)
        ctx.save_for_backward(e / s, idx, mine)
        return -logp_t.mean()

    @staticmethod
    def backward(ctx, g):
        p, idx, mine = ctx.saved_tensors
        onehot = torch.zeros_like(p).scatter_(-1, idx, mine.to(p.dtype))
        return (p - onehot) * (g / p.size(0)), None, None, None


class Config:
    # examples/models/gpt.h
    vocab = 256
    context = 64
    embed = 128
    heads = 4
    layers = 2
    mlp = 512

    def __init__(self, overrides):
        for kv in filter(None, overrides.split(",")):
            k, _, v = kv.partition("=")
            if not hasattr(Config, k) or k.startswith("_"):
                raise SystemExit("gpt_tp_torch.py: unknown config key '%s'" % k)
            setattr(self, k, int(v))

    def __str__(self):
        return "vocab=%d context=%d embed=%d heads=%d layers=%d mlp=%d dropout=0" % (
            self.vocab, self.context, self.embed, self.heads, self.layers, self.mlp)


def build_full(c):
    """The unsharded model, its modules made in gpt.cpp's order so that the
    generator draws the same initial weights."""
    full = {"tok_emb": torch.nn.Embedding(c.vocab, c.embed), "pos_emb": torch.nn.Embedding(c.context, c.embed)}
    for i in range(c.layers):
        b = "blocks.%d." % i
        full[b + "ln1"] = torch.nn.LayerNorm(c.embed)
        full[b + "attn"] = torch.nn.MultiheadAttention(c.embed, c.heads)
        full[b + "ln2"] = torch.nn.LayerNorm(c.embed)
        full[b + "fc1"] = torch.nn.Linear(c.embed, c.mlp)
        full[b + "fc2"] = torch.nn.Linear(c.mlp, c.embed)
    full["ln_f"] = torch.nn.LayerNorm(c.embed)
    full["head"] = torch.nn.Linear(c.embed, c.vocab, bias=False)
    return full


class ShardedGPT:
    """This rank's part of the model: the parameters plans/gpt.yaml leaves on
    it and the forward Megatron runs over them."""

    def __init__(self, c, rank, world):
        for what, n in (("vocab", c.vocab), ("heads", c.heads), ("mlp", c.mlp)):
            if n % world:
                raise SystemExit("gpt_tp_torch.py: %s %d is not divisible by %d ranks" % (what, n, world))
        self.c, self.rank, self.world = c, rank, world
        full = build_full(c)
        self.params = []

        def keep(t):
            p = torch.nn.Parameter(t.detach().clone().contiguous())
            self.params.append(p)
            return p

        def rows(t, n):  # this rank's n-row block of t
            return t.narrow(0, rank * n, n)

        e = c.embed
        self.vocab_local = c.vocab // world
        self.tok_emb = keep(rows(full["tok_emb"].weight, self.vocab_local))
        self.pos_emb = keep(full["pos_emb"].weight)
        self.blocks = []
        for i in range(c.layers):
            f = lambda name: full["blocks.%d.%s" % (i, name)]
            attn = f("attn")
            el = e // world  # this rank's heads' share of each of q, k, v
            w_qkv = torch.cat([rows(w, el) for w in attn.in_proj_weight.chunk(3)])
            b_qkv = torch.cat([rows(b, el) for b in attn.in_proj_bias.chunk(3)])
            ml = c.mlp // world
            self.blocks.append({
                "ln1": (keep(f("ln1").weight), keep(f("ln1").bias)),
                "qkv": (keep(w_qkv), keep(b_qkv)),
                "out": (keep(attn.out_proj.weight.narrow(1, rank * el, el)), keep(attn.out_proj.bias)),
                "ln2": (keep(f("ln2").weight), keep(f("ln2").bias)),
                "fc1": (keep(rows(f("fc1").weight, ml)), keep(rows(f("fc1").bias, ml))),
                "fc2": (keep(f("fc2").weight.narrow(1, rank * ml, ml)), keep(f("fc2").bias)),
            })
        self.ln_f = (keep(full["ln_f"].weight), keep(full["ln_f"].bias))
        self.head = keep(rows(full["head"].weight, self.vocab_local))
        self.unsharded_params = sum(p.numel() for m in full.values() for p in m.parameters())

    def copy_to(self, x):
        return CopyToGroup.apply(x) if self.world > 1 else x

    def reduce_from(self, x):
        return ReduceFromGroup.apply(x) if self.world > 1 else x

    def embed(self, tokens):  # tokens [T, B]
        lo = self.rank * self.vocab_local
        outside = (tokens < lo) | (tokens >= lo + self.vocab_local)
        x = F.embedding((tokens - lo).masked_fill(outside, 0), self.tok_emb)
        return self.reduce_from(x.masked_fill(outside.unsqueeze(-1), 0))

    def attention(self, blk, h, mask):
        t, b, _ = h.shape
        heads = self.c.heads // self.world
        d = self.c.embed // self.c.heads
        q, k, v = F.linear(self.copy_to(h), *blk["qkv"]).chunk(3, dim=-1)
        q = q * (1 / math.sqrt(d))
        q, k, v = (z.contiguous().view(t, b * heads, d).transpose(0, 1) for z in (q, k, v))
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)) + mask, dim=-1)
        ctx = torch.bmm(w, v).transpose(0, 1).contiguous().view(t, b, heads * d)
        w_out, b_out = blk["out"]
        return self.reduce_from(F.linear(ctx, w_out)) + b_out

    def mlp(self, blk, h):
        w2, b2 = blk["fc2"]
        return self.reduce_from(F.linear(F.gelu(F.linear(self.copy_to(h), *blk["fc1"])), w2)) + b2

    def loss(self, tokens, target):  # [B, T] each
        t = tokens.size(1)
        e = self.c.embed
        x = self.embed(tokens.t()) + F.embedding(torch.arange(t), self.pos_emb).unsqueeze(1)
        mask = torch.full((t, t), -math.inf, dtype=x.dtype).triu(1)
        for blk in self.blocks:
            x = x + self.attention(blk, F.layer_norm(x, (e,), *blk["ln1"]), mask)
            x = x + self.mlp(blk, F.layer_norm(x, (e,), *blk["ln2"]))
        logits = F.linear(self.copy_to(F.layer_norm(x, (e,), *self.ln_f)), self.head)
        logits = logits.reshape(-1, logits.size(-1))
        target = target.t().reshape(-1)
        if self.world == 1:
            return F.cross_entropy(logits, target)
        return VocabParallelCrossEntropy.apply(logits, target, self.rank, self.world)

    def min_comm_bytes(self, batch, esize):  # GPTImpl::min_comm_bytes
        if self.world <= 1:
            return 0
        n = batch * self.c.context
        return (2 * n * self.c.embed * (2 * self.c.layers + 1) + 3 * n) * esize


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="", help="KEY=VALUE,... as train_gpt's --config")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 leaves torch's default")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="as train_gpt's --dtype: the model built in float32 from the seed, then converted")
    p.add_argument("--ddp", action="store_true",
                   help="data parallel instead (plans/data_parallel.yaml's peer): the whole model on every "
                        "rank under torch's DistributedDataParallel, each rank training on its slice of the "
                        "global batch")
    return p.parse_args()


class Whole(torch.nn.Module):
    """The unsharded model as one nn.Module, for DistributedDataParallel."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt
        self.ps = torch.nn.ParameterList(gpt.params)

    def forward(self, tokens, target):
        return self.gpt.loss(tokens, target)


def build(a, c, rank, world):
    """The model this rank trains and the function that gives its loss."""
    torch.manual_seed(a.seed)
    gpt = ShardedGPT(c, 0 if a.ddp else rank, 1 if a.ddp else world)
    dtype = {"float32": torch.float32, "float64": torch.float64}[a.dtype]
    for p in gpt.params:  # in place: the blocks hold these same Parameters
        p.data = p.data.to(dtype)
    if a.ddp and world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(Whole(gpt))  # DDP's defaults: 25 MiB buckets, 1 MiB first
        timeline.register_ddp_hook(ddp)  # only while a trace is on: DDP's own C++ hook otherwise
        return gpt, ddp.parameters(), ddp
    return gpt, gpt.params, gpt.loss


def report_start(a, c, gpt, world, esize):
    print("model gpt: %s; %d parameters" % (c, gpt.unsharded_params))
    if world > 1 and a.ddp:
        grad_bytes = sum(p.numel() for p in gpt.params) * esize
        print("plan: torch.distributed gloo, DistributedDataParallel over %d ranks (%d gradient bytes)" %
              (world, grad_bytes))
    elif world > 1:
        print("plan: torch.distributed gloo, Megatron-style by hand, over %d ranks" % world)


def main():
    a = parse()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        timeline.start(rank, world)
    c = Config(a.config)
    lead = rank == 0
    esize = 8 if a.dtype == "float64" else 4
    gpt, params, loss_of = build(a, c, rank, world)
    if lead:
        report_start(a, c, gpt, world, esize)
    opt = torch.optim.Adam(params, lr=a.lr)

    with open(a.data, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    gen = torch.Generator()
    gen.manual_seed(a.seed + 1)
    length = c.context + 1
    if a.ddp and a.batch % world:
        raise SystemExit("gpt_tp_torch.py: --batch %d does not divide over %d ranks" % (a.batch, world))
    local = a.batch // world if a.ddp else a.batch

    def sample():  # Corpus::windows; under DDP this rank's rows (DataParallel::local_batch)
        start = torch.randint(corpus.numel() - length, (a.batch, 1), generator=gen, dtype=torch.long)
        w = torch.take(corpus, start + torch.arange(length))
        if a.ddp:
            w = w.narrow(0, rank * local, local)
        return w.narrow(1, 0, c.context), w.narrow(1, 1, c.context)

    items = a.batch * c.context
    since, since_step, loss_sum = time.monotonic(), 0, 0.0
    for step in range(1, a.steps + 1):
        timeline.step(step)
        tokens, target = sample()
        opt.zero_grad()
        loss = loss_of(tokens, target)
        loss.backward()
        opt.step()
        if step == 1 and lead and world > 1 and not a.ddp:
            print("communicated in step 1 (forward + backward) on rank 0: %d bytes in %d calls; "
                  "theoretical minimum for plans/gpt.yaml: %d bytes" % (Stats.bytes, Stats.calls,
                                                                      gpt.min_comm_bytes(a.batch, esize)))
        value = loss.item()
        loss_sum += value
        if step % a.log_every == 0 or step == 1 or step == a.steps:
            if a.ddp and world > 1:  # the data axis' average, as train_gpt prints it, at log steps only
                both = timeline.traced_all_reduce(torch.tensor([value, loss_sum], dtype=torch.float64),
                                                  dist.ReduceOp.SUM, "data")
                value, loss_sum = both[0].item() / world, both[1].item() / world
            now = time.monotonic()
            rate = (step - since_step) * items / max(now - since, 1e-9)
            if lead:
                print("step %4d  loss %.*f  mean %.4f  tokens/s %.0f" % (
                    step, 12 if a.dtype == "float64" else 8, value, loss_sum / (step - since_step), rate), flush=True)
            since, since_step, loss_sum = now, step, 0.0
    if world > 1:
        if not a.ddp:
            for r in range(world):
                if r == rank:
                    print("rank %d: communicated %d bytes in %d calls over %d steps (%d per step; theoretical "
                          "minimum %d)" % (rank, Stats.bytes, Stats.calls, a.steps, Stats.bytes // a.steps,
                                           gpt.min_comm_bytes(a.batch, esize)), flush=True)
                dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
