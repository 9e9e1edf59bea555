"""Ulysses sequence parallelism (DeepSpeed-Ulysses) for self-attention.

Activations ``(s, b, h)`` are sharded along the sequence (dim 0, as DeepSpeed lays them out).
Before attention an all-to-all re-shards the projected queries, keys and values from sequence
blocks of all heads to the whole sequence for ``heads/c`` heads; attention runs per head; a
second all-to-all re-shards the context back to sequence blocks. The projections are
replicated. At degree 1 the all-to-alls are left out, so the baseline is the same code.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from .parallel import Parallel, all_to_all


class UlyssesAttention(nn.Module):
    """(s/c, b, h) -> (s/c, b, h), every projection replicated."""

    def __init__(self, hidden: int, heads: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.heads, self.head_dim = heads, hidden // heads
        ps.shard(heads, "heads")
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def _to_heads(self, t: Tensor) -> Tensor:
        """(s/c, b, heads, hd) sequence blocks -> (s, b, heads/c, hd) head blocks."""
        ps = self.ps
        if ps.tp == 1:
            return t
        s_local, b, heads, hd = t.shape
        if ps.has("ulysses_batch_split"):
            # DeepSpeed #5808: the all-to-all splits a (s/c, b*heads, hd) view into c pieces, so
            # with b > 1 it splits the batch, not the heads; viewing the result as
            # (s, b, heads/c, hd) then mixes batch rows and heads (right only when b == 1).
            moved = all_to_all(t.reshape(s_local, b * heads, hd), 1, 0, ps.groups)  # BUG-SITE: ulysses_batch_split
            return moved.reshape(s_local * ps.tp, b, heads // ps.tp, hd)
        return all_to_all(t, 2, 0, ps.groups)

    def forward(self, x: Tensor) -> Tensor:
        s_local, b, _ = x.shape
        hd = self.head_dim
        q, k, v = (self._to_heads(f(x).reshape(s_local, b, self.heads, hd)).permute(1, 2, 0, 3) for f in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(2, 0, 1, 3)  # (s, b, heads/c, hd)
        if self.ps.tp > 1:
            ctx = all_to_all(ctx, 0, 2, self.ps.groups)  # back to sequence blocks of all heads
        return self.out(ctx.reshape(s_local, b, self.heads * hd))
