"""Entry points on fairscale 0.4.13's model-parallel layers, unmodified, as Meta's Llama uses them.

fairscale reads the rank from ``torch.distributed`` and builds its weights with the legacy
constructor (``Parameter(torch.Tensor(out, in))``) before copying a master weight's block into
them (``torch.cat(..., out=weight)``). The entry points build everything where the front end
runs them, on the meta device: nothing here moves a module anywhere. The baseline is the same
code with a model-parallel world of one.
"""

from __future__ import annotations

import math
from typing import Any

import fairscale_bugs as bugs
import torch
import torch.nn.functional as F
from fairscale.nn.model_parallel import initialize as fs_init
from fairscale.nn.model_parallel.layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def model_parallel(size: int) -> None:
    """fairscale's groups over the started world (a training script calls this once)."""
    if fs_init.model_parallel_is_initialized():
        fs_init.destroy_model_parallel()
    fs_init.initialize_model_parallel(size)


def _keep(weight: torch.Tensor) -> torch.Tensor:
    """The init Meta's Llama passes (weights come from a checkpoint)."""
    return weight


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of the (even, odd) pairs of the head dim, in real arithmetic."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def rotary_tables(head_dim: int, seq: int, device: Any, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), freqs)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


class Attention(torch.nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        mp = fs_init.get_model_parallel_world_size()
        self.local_heads = heads // mp
        self.local_kv_heads = kv_heads // mp
        self.head_dim = dim // heads
        self.wq = ColumnParallelLinear(dim, heads * self.head_dim, bias=False, gather_output=False, init_method=_keep)
        self.wk = ColumnParallelLinear(dim, kv_heads * self.head_dim, bias=False, gather_output=False, init_method=_keep)
        self.wv = ColumnParallelLinear(dim, kv_heads * self.head_dim, bias=False, gather_output=False, init_method=_keep)
        self.wo = RowParallelLinear(heads * self.head_dim, dim, bias=False, input_is_parallel=True, init_method=_keep)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.local_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.local_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.local_kv_heads, self.head_dim)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        repeat = self.local_heads // self.local_kv_heads
        k = k.repeat_interleave(repeat, dim=2)
        v = v.repeat_interleave(repeat, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, -1)
        return self.wo(out)


class FeedForward(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = ColumnParallelLinear(dim, hidden, bias=False, gather_output=False, init_method=_keep)
        self.w2 = RowParallelLinear(hidden, dim, bias=False, input_is_parallel=True, init_method=_keep)
        self.w3 = ColumnParallelLinear(dim, hidden, bias=False, gather_output=False, init_method=_keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(torch.nn.Module):
    """A Llama decoder on fairscale's layers: embedding-dim-parallel token embedding, column /
    row parallel attention and SwiGLU, a column-parallel output layer that gathers the logits."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.tok_embeddings = ParallelEmbedding(vocab, dim, init_method=_keep)
        self.layers = torch.nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = ColumnParallelLinear(dim, vocab, bias=False, init_method=_keep)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, s = tokens.shape
        h = self.tok_embeddings(tokens)
        cos, sin = rotary_tables(h.shape[-1] // self.heads, s, tokens.device)
        mask = torch.triu(torch.full((s, s), float("-inf"), device=tokens.device), diagonal=1)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.output(self.norm(h)).float()


class Mlp(torch.nn.Module):
    """ColumnParallelLinear (bias) -> gelu -> RowParallelLinear (bias), Megatron's classic MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(dim, hidden, gather_output=False)
        self.fc2 = RowParallelLinear(hidden, dim, input_is_parallel=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Embeddings(torch.nn.Module):
    """One of fairscale's embeddings: embedding-dim-parallel (``ParallelEmbedding``: a lookup in
    the rank's columns, all-gathered along the last dim) or vocabulary-parallel
    (``VocabParallelEmbedding``: ids outside the rank's rows masked, lookups all-reduced)."""

    def __init__(self, vocab: int, dim: int, vocab_parallel: bool) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(vocab, dim) if vocab_parallel else ParallelEmbedding(vocab, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)


def _sizes(ctx: BuildContext) -> dict[str, int]:
    return {k: ctx.knob(k, d) for k, d in (("vocab", 64), ("dim", 32), ("layers", 2), ("heads", 4), ("kv_heads", 4), ("ffn", 64), ("seq", 8), ("batch", 2))}


def llama(ctx: BuildContext) -> Model:
    n = _sizes(ctx)

    def build() -> Llama:
        return Llama(n["vocab"], n["dim"], n["layers"], n["heads"], n["kv_heads"], n["ffn"])

    model_parallel(1)
    baseline = build()

    def distributed(rank: int) -> Llama:
        model_parallel(ctx.tp)
        return build()

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("tokens", (n["batch"], n["seq"]), "int64", int_range=(0, n["vocab"]))],
        plan={
            "tok_embeddings": {"shard": 1},
            "layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise", "layers.*.attention.wv": "colwise",
            "layers.*.attention.wo": "rowwise",
            "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w3": "colwise", "layers.*.feed_forward.w2": "rowwise",
            "output": "colwise",
        },
    )


def mlp(ctx: BuildContext) -> Model:
    n = _sizes(ctx)
    model_parallel(1)
    baseline = Mlp(n["dim"], n["ffn"])

    def distributed(rank: int) -> Mlp:
        bugs.apply(ctx.variant)
        model_parallel(ctx.tp)
        return Mlp(n["dim"], n["ffn"])

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (n["batch"], n["seq"], n["dim"]))],
        plan={"fc1": "colwise", "fc2": "rowwise"},
    )


def embeddings(ctx: BuildContext) -> Model:
    n = _sizes(ctx)
    vocab_parallel = ctx.knob("vocab_parallel", False)
    model_parallel(1)
    baseline = Embeddings(n["vocab"], n["dim"], vocab_parallel)

    def distributed(rank: int) -> Embeddings:
        bugs.apply(ctx.variant)
        model_parallel(ctx.tp)
        return Embeddings(n["vocab"], n["dim"], vocab_parallel)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("tokens", (n["batch"], n["seq"]), "int64", int_range=(0, n["vocab"]))],
        plan={"embed": {"shard": 0 if vocab_parallel else 1}},
    )
