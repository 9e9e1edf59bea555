"""Tensor-parallel building blocks: column/row-parallel linears, the vocab-parallel embedding
and LM head (with a vocab-parallel cross-entropy), RMSNorm and rotary tables.

Weights follow ``nn.Linear``'s (out_features, in_features) convention, so the sharding plan
styles mean what they mean in PyTorch: a column-parallel weight is split along dim 0, a
row-parallel one along dim 1, the vocab-parallel table along the vocabulary (dim 0).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .parallel import (
    Parallel,
    all_reduce_max,
    all_reduce_sum,
    copy_to_region,
    gather_last_dim,
    gather_sequence,
    reduce_from_region,
    reduce_scatter_sequence,
)


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W split along its output features: each rank computes its slice of y.

    Under sequence parallelism the input arrives sharded along the sequence and is gathered
    here, as Megatron-LM does, so the gather is paid once per layer input.
    """

    def __init__(self, in_features: int, out_features: int, ps: Parallel, bias: bool = False, pad_unit: int = 0) -> None:
        super().__init__()
        self.ps = ps
        # pad_unit > 0: the output features (units of pad_unit: a head's width, or 1) do not
        # divide over the ranks; each rank holds its block of them padded with zero rows to a
        # multiple of the degree (plan: padded).
        local = ps.padded(out_features // pad_unit) * pad_unit if pad_unit else ps.shard(out_features, "output features")
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.empty(local)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        x = gather_sequence(x, self.ps) if self.ps.sequence_parallel else copy_to_region(x, self.ps)
        y = F.linear(x, self.weight)
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(nn.Module):
    """y = x W^T with W split along its input features: each rank holds a partial sum of y,
    reduced across the group (all-reduce, or reduce-scatter along the sequence under SP)."""

    def __init__(self, in_features: int, out_features: int, ps: Parallel, bias: bool = False, reduce: bool = True, pad_unit: int = 0) -> None:
        super().__init__()
        self.ps = ps
        self.reduce = reduce
        # pad_unit > 0: the input features padded with zero columns, in units of pad_unit.
        local = ps.padded(in_features // pad_unit) * pad_unit if pad_unit else ps.shard(in_features, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)
        if self.reduce:
            y = reduce_scatter_sequence(y, self.ps) if self.ps.sequence_parallel else reduce_from_region(y, self.ps)
        return y + self.bias if self.bias is not None else y


def vocab_parallel_lookup(ids: Tensor, table: Tensor, ps: Parallel) -> Tensor:
    """Rows ``table[ids]`` of a table split along the vocabulary: rank r owns ids
    [r·w, (r+1)·w) and returns zeros for the others, so the rows summed over the ranks are the
    whole-table lookup (Megatron's VocabParallelEmbedding)."""
    if ps.tp == 1:
        return F.embedding(ids, table)
    width = table.shape[0]
    local = ids - ps.rank * width
    outside = (local < 0) | (local >= width)
    local = local.masked_fill(outside, 0)
    rows = F.embedding(local, table)
    return rows.masked_fill(outside.unsqueeze(-1), 0.0)


class VocabParallelEmbedding(nn.Embedding):
    """Token embedding with the table split along the vocabulary; ``(s, b)`` ids to
    ``(s, b, h)`` rows (``(s/c, b, h)`` under sequence parallelism)."""

    def __init__(self, vocab: int, dim: int, ps: Parallel) -> None:
        super().__init__(ps.shard(vocab, "vocabulary"), dim)
        self.ps = ps

    def forward(self, ids: Tensor) -> Tensor:
        s, b = ids.shape
        rows = vocab_parallel_lookup(ids.reshape(s * b), self.weight, self.ps).reshape(s, b, -1)
        return reduce_scatter_sequence(rows, self.ps) if self.ps.sequence_parallel else reduce_from_region(rows, self.ps)


class ParallelLMHead(nn.Module):
    """Output projection split along the vocabulary, with a vocab-parallel cross-entropy that
    never gathers the logits: the log-sum-exp is assembled from per-rank maxima and sums, and
    the target's logit from the rank that owns the target's row of the weight."""

    def __init__(self, hidden: int, vocab: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.weight = nn.Parameter(torch.empty(ps.shard(vocab, "vocabulary"), hidden))

    def forward(self, rows: Tensor) -> Tensor:
        """(T, h) token rows to (T, V) logits, gathered from the ranks' vocabulary slices."""
        return gather_last_dim(F.linear(copy_to_region(rows, self.ps), self.weight), self.ps)

    def loss(self, rows: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of (T, h) token rows against (T,) target ids."""
        ps = self.ps
        rows = copy_to_region(rows, ps)
        logits = F.linear(rows, self.weight)  # (T, V/c): this rank's slice of the vocabulary
        if ps.has("ce_on_gathered_logits"):
            logits = gather_last_dim(logits, ps)  # the whole vocabulary, fed to the vocab-parallel loss below
        top = all_reduce_max(logits.amax(dim=-1, keepdim=True), ps)
        total = all_reduce_sum(torch.exp(logits - top).sum(dim=-1), ps)  # BUG-SITE: ce_on_gathered_logits
        lse = torch.log(total) + top.squeeze(-1)
        # The target logit is the target's row of the weight times the hidden state; only the
        # rank owning that row contributes, so a sum over ranks finishes it.
        picked = all_reduce_sum((rows * vocab_parallel_lookup(targets, self.weight, ps)).sum(dim=-1), ps)
        loss = (lse - picked).mean()
        if ps.has("loss_scaled_by_tp"):
            loss = loss * ps.tp  # BUG-SITE: loss_scaled_by_tp
        return loss


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq: int, head_dim: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, (seq, head_dim), both halves repeated (Llama/NeoX)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    positions = torch.arange(seq, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()
