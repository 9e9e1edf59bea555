"""A tensor-parallel MLP whose row-parallel output is summed by a ring all-reduce.

The down projection leaves each rank one term of the sum over the ranks. Instead of an
all-reduce, the terms travel around the ring with collective-permutes: after ``c - 1`` steps
every rank has added every rank's term once (the naive ring all-reduce; the ring attention and
collective matmul of context parallelism move blocks the same way).
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
