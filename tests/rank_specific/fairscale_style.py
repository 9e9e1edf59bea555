"""A Llama decoder written the way fairscale's model-parallel layers (and Meta's reference Llama)
write it, for the rank-specific comparison (tests/test_rank_specific.py).

Only ``torch.distributed`` is used, as fairscale does: a model-parallel group made with
``new_group``, ``all_reduce`` after a row-parallel linear, and the list form of ``all_gather``
whose output list holds the rank's own input in its own slot (``tensor_list[rank] = input_``),
concatenated along the last dim. Variants (``ctx.variant``):

- ``wrong_offset``: rank 2 rotates its queries (not its keys) from a wrong first position (a
  rank-specific literal that changes what the model computes: a real bug). The same offset on
  queries and keys would be harmless: attention sees only relative positions.

``feed_forward`` is a norm and a SwiGLU block whose first rank runs it once more before the
traced call (a warm-up whose result is dropped): torch-xla's process-wide scope counters then
differ between the ranks' programs, which differ in nothing else.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class Parallel:
    """The model-parallel group of a rank (fairscale's initialize_model_parallel, in short)."""

    def __init__(self, groups: list[list[int]] | None, rank: int) -> None:
        self.group = None
        self.rank, self.size = 0, 1
        if groups is not None:
            made = [dist.new_group(g) for g in groups]  # every rank makes every group, in order
            for handle, ranks in zip(made, groups, strict=True):
                if rank in ranks:
                    self.group, self.rank, self.size = handle, ranks.index(rank), len(ranks)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        dist.all_reduce(x, group=self.group)
        return x

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """fairscale's _gather: the list all_gather with the rank's own slot set to its input."""
        if self.size == 1:
            return x
        tensor_list = [torch.empty_like(x) for _ in range(self.size)]
        tensor_list[self.rank] = x
        dist.all_gather(tensor_list, x, group=self.group)
        return torch.cat(tensor_list, dim=x.dim() - 1).contiguous()


class ColumnParallelLinear(torch.nn.Module):
    def __init__(self, inp: int, out: int, mp: Parallel, gather_output: bool = True) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out // mp.size, inp))
        self.mp, self.gather_output = mp, gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return self.mp.gather_last(y) if self.gather_output else y


class RowParallelLinear(torch.nn.Module):
    def __init__(self, inp: int, out: int, mp: Parallel) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out, inp // mp.size))
        self.mp = mp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mp.reduce(F.linear(x, self.weight))


class ParallelEmbedding(torch.nn.Module):
    """fairscale's ParallelEmbedding: the embedding dim split, gathered along it."""

    def __init__(self, vocab: int, dim: int, mp: Parallel) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, dim // mp.size))
        self.mp = mp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mp.gather_last(F.embedding(ids, self.weight))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, offset: int) -> torch.Tensor:
    """Rotary embedding in its real (rotate-half) form; ``offset`` is the first position."""
    s, hd = x.shape[-3], x.shape[-1]
    pos = torch.arange(s, device=x.device, dtype=torch.float32) + offset
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    half = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + half * sin


class Attention(torch.nn.Module):
    def __init__(self, dim: int, heads: int, mp: Parallel, offset: int = 0) -> None:
        super().__init__()
        self.local_heads, self.hd, self.offset = heads // mp.size, dim // heads, offset
        self.wq = ColumnParallelLinear(dim, dim, mp, gather_output=False)
        self.wk = ColumnParallelLinear(dim, dim, mp, gather_output=False)
        self.wv = ColumnParallelLinear(dim, dim, mp, gather_output=False)
        self.wo = RowParallelLinear(dim, dim, mp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.local_heads, self.hd)
        k = self.wk(x).view(b, s, self.local_heads, self.hd)
        v = self.wv(x).view(b, s, self.local_heads, self.hd)
        q, k = rotate(q, self.offset), rotate(k, 0)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / (self.hd**0.5)
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        probs = F.softmax(scores + mask, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, -1)
        return self.wo(out)


class FeedForward(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, mp: Parallel) -> None:
        super().__init__()
        self.w1 = ColumnParallelLinear(dim, hidden, mp, gather_output=False)
        self.w2 = RowParallelLinear(hidden, dim, mp)
        self.w3 = ColumnParallelLinear(dim, hidden, mp, gather_output=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, mp: Parallel, offset: int = 0) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, mp, offset)
        self.feed_forward = FeedForward(dim, hidden, mp)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(torch.nn.Module):
    def __init__(self, n: dict[str, int], mp: Parallel, offset: int = 0) -> None:
        super().__init__()
        self.tok_embeddings = ParallelEmbedding(n["vocab"], n["dim"], mp)
        self.layers = torch.nn.ModuleList(Block(n["dim"], n["heads"], n["hidden"], mp, offset) for _ in range(n["layers"]))
        self.norm = RMSNorm(n["dim"])
        self.output = ColumnParallelLinear(n["dim"], n["vocab"], mp, gather_output=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


PLAN = {
    "tok_embeddings": {"shard": 1},
    "layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise", "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise", "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
    "output": "colwise",
}


def llama(ctx: BuildContext) -> Model:
    n = {"vocab": ctx.knob("vocab", 64), "dim": ctx.knob("dim", 32), "heads": ctx.knob("heads", 4), "hidden": ctx.knob("hidden", 64), "layers": ctx.knob("layers", 2)}
    seq = ctx.knob("seq", 8)

    def distributed(rank: int) -> Any:
        mp = Parallel(ctx.groups, rank)
        offset = 1 if ctx.variant == "wrong_offset" and rank == 2 else 0
        return Transformer(n, mp, offset)

    return Model(
        baseline=Transformer(n, Parallel(None, 0)),
        distributed=distributed,
        inputs=[Input("ids", (2, seq), dtype="int64", int_range=(0, n["vocab"]))],
        plan=PLAN,
    )


class WarmFeedForward(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, mp: Parallel, warm: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden, mp)
        self.warm = warm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.warm:  # a warm-up call whose result is dropped: it only advances scope counters
            self.warm = False
            self.feed_forward(self.norm(x * 0.5))
        return x + self.feed_forward(self.norm(x))


def feed_forward(ctx: BuildContext) -> Model:
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    first = min(r for g in ctx.groups for r in g)
    return Model(
        baseline=WarmFeedForward(dim, hidden, Parallel(None, 0), warm=False),
        distributed=lambda rank: WarmFeedForward(dim, hidden, Parallel(ctx.groups, rank), warm=rank == first),
        inputs=[Input("x", (2, 8, dim))],
        plan={"feed_forward.w1": "colwise", "feed_forward.w3": "colwise", "feed_forward.w2": "rowwise"},
    )
