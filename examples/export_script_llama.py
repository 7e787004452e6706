#!/usr/bin/env python3
"""Exports a small Llama-family byte-level language model as TorchScript,
for examples/train_script.cpp (docs/TORCHSCRIPT.md).

  export_script_llama.py OUT.pt [--double]

Hugging Face's LlamaForCausalLM layout and parameter names
(model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj,
model.layers.N.mlp.{gate,up,down}_proj, model.layers.N.input_layernorm,
model.layers.N.post_attention_layernorm, model.norm, lm_head): RMSNorm,
rotary positions in the rotate-half convention, grouped-query attention and
a SwiGLU MLP, no biases. The shape is examples/models/llama.h's default but
with 8 query and 4 key/value heads, so that both counts divide at 2 and 4
ranks; they are the integer attributes `num_heads` and
`num_key_value_heads`, which examples/script_llama.yaml's `divide:` splits.
Exit 77 when torch is missing.
"""
import math
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

from export_script_gpt import export  # this script's directory is on sys.path

VOCAB, CONTEXT, EMBED, HEADS, KV_HEADS, LAYERS, MLP = 256, 64, 128, 8, 4, 2, 352
ROPE_THETA, RMS_EPS = 10000.0, 1e-6


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(EMBED))
        self.variance_epsilon = RMS_EPS

    def forward(self, x):
        # In x's own dtype: Hugging Face upcasts to float32, which would
        # round a float64 export's norms.
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class RotaryEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        head_dim = EMBED // HEADS
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        # Not in the state dict, as Hugging Face's; a buffer, so .double()
        # makes the angles float64 too.
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, T: int):
        positions = torch.arange(T, dtype=self.inv_freq.dtype, device=self.inv_freq.device)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep: int):
    """Hugging Face's: each key/value head serves n_rep query heads."""
    if n_rep == 1:
        return x
    b, h, t, d = x.size()
    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        # The head counts are attributes (the plan divides them per rank);
        # the head size and the group size stay as they are.
        self.num_heads = HEADS
        self.num_key_value_heads = KV_HEADS
        self.head_dim = EMBED // HEADS
        self.q_proj = nn.Linear(EMBED, HEADS * self.head_dim, bias=False)
        self.k_proj = nn.Linear(EMBED, KV_HEADS * self.head_dim, bias=False)
        self.v_proj = nn.Linear(EMBED, KV_HEADS * self.head_dim, bias=False)
        self.o_proj = nn.Linear(HEADS * self.head_dim, EMBED, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.size()
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.num_heads // self.num_key_value_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(EMBED, MLP, bias=False)
        self.up_proj = nn.Linear(EMBED, MLP, bias=False)
        self.down_proj = nn.Linear(MLP, EMBED, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm()
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = RMSNorm()
        self.mlp = LlamaMLP()

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, EMBED)
        self.layers = nn.ModuleList([LlamaDecoderLayer() for _ in range(LAYERS)])
        self.norm = RMSNorm()
        self.rotary_emb = RotaryEmbedding()

    def forward(self, idx):
        x = self.embed_tokens(idx)
        cos, sin = self.rotary_emb(idx.size(1))
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.context = CONTEXT  # train_script's windows and generation crop to it
        self.model = LlamaModel()
        self.lm_head = nn.Linear(EMBED, VOCAB, bias=False)
        for m in self.modules():
            # Hugging Face's initializer_range.
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        return self.lm_head(self.model(idx))


if __name__ == "__main__":
    export(LlamaForCausalLM, sys.argv, __doc__)
