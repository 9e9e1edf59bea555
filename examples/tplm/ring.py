"""A tensor-parallel MLP whose row-parallel output is summed by a ring all-reduce.

The down projection leaves each rank one term of the sum over the ranks. Instead of an
all-reduce, the terms travel around the ring with collective-permutes: after ``c - 1`` steps
every rank has added every rank's term once (the naive ring all-reduce; ``RingAttention``
below moves key/value blocks the same way, folding each into an online softmax).
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .parallel import Parallel, ring_shift


class RingMLP(nn.Module):
    """(s, b, h) -> (s, b, h): column-parallel up, row-parallel down, ring all-reduce, residual."""

    def __init__(self, hidden: int, ffn: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.up = nn.Linear(hidden, ps.shard(ffn, "ffn"), bias=False)
        self.down = nn.Linear(ps.shard(ffn, "ffn"), hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        ps = self.ps
        term = self.down(F.silu(self.up(x)))  # this rank's term of the sum over the ranks
        total, moving = term, term
        steps = ps.tp - 2 if ps.has("ring_step_off_by_one") else ps.tp - 1
        for _ in range(steps):
            moving = ring_shift(moving, ps.groups)  # receive the previous rank's term
            total = total + moving
        return x + total  # BUG-SITE: ring_step_off_by_one


class RingAttention(nn.Module):
    """Ring attention (context parallelism): ``(s/c, b, h) -> (s/c, b, h)``.

    Activations are sharded along the sequence (dim 0). Each rank projects its own queries,
    keys and values (replicated projections); its queries stay put while the key/value blocks
    travel around the ring (collective-permute by one place per step), so after ``c`` steps
    every query block has met every key block once. Each step's scores are folded into an
    online softmax (flash attention's update): the running row max ``m``, the running
    denominator ``denom`` and the running numerator ``acc``, both rescaled by ``exp(m_old - m_new)``
    when a block raises the max; the context is ``acc / denom``. At degree 1 it is one step over the
    whole sequence, i.e. plain softmax attention (no mask: bidirectional).
    """

    def __init__(self, hidden: int, heads: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.heads, self.head_dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        ps = self.ps
        s, b, _ = x.shape
        hd = self.head_dim

        def heads(t: Tensor) -> Tensor:  # (s/c, b, hidden) -> (b, heads, s/c, hd)
            return t.reshape(s, b, self.heads, hd).permute(1, 2, 0, 3)

        q = heads(self.q(x)) * hd**-0.5
        k_blk, v_blk = self.k(x), self.v(x)  # travel in the (s/c, b, hidden) layout
        m = denom = acc = None
        steps = ps.tp - 1 if ps.has("ring_attn_step_off_by_one") else ps.tp
        for step in range(steps):  # ring_attn_step_off_by_one: one key/value block never arrives
            if step:  # receive the previous rank's key/value block
                k_blk, v_blk = ring_shift(k_blk, ps.groups), ring_shift(v_blk, ps.groups)
            k, v = heads(k_blk), heads(v_blk)
            scores = q @ k.transpose(-1, -2)  # (b, heads, s/c, s/c): one key block
            block_max = scores.amax(dim=-1, keepdim=True)
            if m is None:
                m = block_max
                p = (scores - m).exp()
                denom, acc = p.sum(dim=-1, keepdim=True), p @ v
                continue
            m_new = m.maximum(block_max)
            scale = (m - m_new).exp()  # rescales what earlier blocks added under the old max
            p = (scores - m_new).exp()
            denom = denom * scale + p.sum(dim=-1, keepdim=True)
            acc = acc * scale + p @ v
            m = m_new
        ctx = (acc / denom).permute(2, 0, 1, 3).reshape(s, b, self.heads * hd)  # BUG-SITE: ring_attn_step_off_by_one
        return self.out(ctx)
