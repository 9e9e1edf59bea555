"""One decoding step of grouped-query attention over a KV cache split along the sequence:
flash-decoding-style split-KV attention across ranks.

Each rank holds a contiguous ``1/c`` of every sequence's cached keys and values and cuts it into
splits of ``chunk`` positions. Every split yields a partial numerator (probabilities times
values) and a partial denominator; the splits are combined with an unrolled loop of adds and
then across ranks with an all-reduce. All splits share one maximum (reduced with
all-reduce(max) first, as FlashDecoding++'s unified maximum), so the partial results add up
without the per-split rescaling of the original flash-decoding combine.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from .parallel import Parallel, all_reduce_max, all_reduce_sum


class SplitKVDecode(nn.Module):
    """(b, h) hidden state of the new token, caches (b, kv_heads, L, head_dim) -> (b, h)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, chunk: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.heads, self.kv_heads, self.chunk = heads, kv_heads, chunk
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        ps = self.ps
        b, g, length, hd = k_cache.shape  # length: this rank's part of the cache
        rep = self.heads // g
        splits = length // self.chunk
        q = self.q(x).reshape(b, g, rep, hd)  # query heads grouped by the KV head they share
        scores = torch.einsum("bgrd,bgld->bgrl", q, k_cache) / math.sqrt(hd)
        top = scores.amax(dim=-1, keepdim=True)
        if not ps.has("decode_local_max"):
            top = all_reduce_max(top, ps)
        p = torch.exp(scores - top).reshape(b, g, rep, splits, self.chunk)  # BUG-SITE: decode_local_max
        values = v_cache.reshape(b, g, splits, self.chunk, hd)
        num = torch.einsum("bgrsc,bgscd->bgrsd", p, values)  # per-split numerators
        den = p.sum(dim=-1)  # per-split denominators (b, g, rep, splits)
        acc_num, acc_den = num[:, :, :, 0:1], den[..., 0:1]
        for j in range(1, splits):
            acc_num = acc_num + num[:, :, :, j : j + 1]
            acc_den = acc_den + den[..., j : j + 1]
        acc_num = all_reduce_sum(acc_num, ps)
        acc_den = all_reduce_sum(acc_den, ps)
        ctx = acc_num / acc_den.unsqueeze(-1)  # (b, g, rep, 1, hd)
        return self.out(ctx.reshape(b, self.heads * hd))
