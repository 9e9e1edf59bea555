"""A Mixtral-style mixture of experts with expert parallelism, or tensor-parallel experts.

Expert parallel (when the experts divide over the ranks): each rank owns ``experts / c``
experts, their slice of the router and their stacked SwiGLU weights (plan style ``expert``:
split along dim 0). Routing is top-k over *all* experts without gathering the router logits:
the k-th largest logit comes from per-rank maxima reduced with all-reduce(max), the softmax
denominator of the chosen experts from an all-reduce(sum).

Tensor-parallel experts (more ranks than experts, e.g. Mixtral's 8 experts at TP 32, as
Megatron-LM does with expert-parallel size 1): every rank holds the whole router and every
expert, each expert's SwiGLU split along its ffn dim like a column/row-parallel MLP (gate+up
along dim 1 with blocks [ffn, ffn], down along dim 2). Routing is the same on every rank; each
expert's output is a partial sum over the ranks.

Every local expert runs on every token (the dense formulation: weights of unchosen experts are
zero), and the combine is an unrolled loop of adds over the rank's experts followed by an
all-reduce over the expert-parallel group.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .parallel import (
    Groups,
    Parallel,
    all_reduce_max,
    all_reduce_sum,
    all_to_all,
    gather_sequence,
    reduce_scatter_sequence,
)


def expert_parallel(experts: int, tp: int) -> bool:
    """Whole experts per rank when they divide over the ranks; tensor-parallel experts else."""
    return experts % tp == 0


class MoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.top_k = top_k
        self.expert_parallel = expert_parallel(experts, ps.tp)
        self.local = ps.shard(experts, "experts") if self.expert_parallel else experts
        ffn_local = ffn if self.expert_parallel else ps.shard(ffn, "expert ffn")
        self.router = nn.Parameter(torch.empty(self.local, hidden))
        self.gate_up = nn.Parameter(torch.empty(self.local, 2 * ffn_local, hidden))
        self.down = nn.Parameter(torch.empty(self.local, hidden, ffn_local))

    def _groups(self) -> Groups:
        ps = self.ps
        if ps.has("moe_wrong_groups"):
            # Expert-parallel groups built with a stride as if half the ranks were data
            # parallel: {0, 2, ...} and {1, 3, ...} instead of the whole group.
            ranks = ps.groups[0]
            return [ranks[0::2], ranks[1::2]]
        return ps.groups

    def routing(self, rows: Tensor) -> Tensor:
        """(T, local experts) gate weights: softmax over each token's top-k experts, 0 elsewhere."""
        ps = self.ps
        # Over the expert-parallel group when the experts are split; every rank has them all
        # otherwise.
        rmax = (lambda t: all_reduce_max(t, ps)) if self.expert_parallel else (lambda t: t)
        rsum = (lambda t: all_reduce_sum(t, ps)) if self.expert_parallel else (lambda t: t)
        logits = F.linear(rows, self.router)  # (T, E/c): this rank's experts
        lowest = torch.finfo(logits.dtype).min
        top = rmax(logits.amax(dim=-1, keepdim=True))
        threshold, remaining = top, logits
        for _ in range(self.top_k - 1):
            remaining = remaining.masked_fill(remaining >= threshold, lowest)
            threshold = rmax(remaining.amax(dim=-1, keepdim=True))
        chosen = torch.exp(logits - top).masked_fill(logits < threshold, 0.0)
        return chosen / rsum(chosen.sum(dim=-1, keepdim=True))

    def forward(self, x: Tensor) -> Tensor:
        if self.ps.sequence_parallel:
            x = gather_sequence(x, self.ps)
        s, b, h = x.shape
        rows = x.reshape(s * b, h)
        weights = self.routing(rows)  # (T, E/c)
        gate, up = torch.einsum("th,efh->etf", rows, self.gate_up).chunk(2, dim=-1)
        y = torch.einsum("etf,ehf->eth", F.silu(gate) * up, self.down)  # (E/c, T, h)
        y = y * weights.t().unsqueeze(-1)
        out = y[0:1]
        for e in range(1, self.local):
            out = out + y[e : e + 1]
        out = out.reshape(s, b, h)
        if self.ps.sequence_parallel:
            return reduce_scatter_sequence(out, self.ps)
        if self.ps.has("moe_missing_allreduce"):
            return out
        return all_reduce_sum(out, self.ps, self._groups())  # BUG-SITE: moe_wrong_groups


class AllToAllMoE(nn.Module):
    """Expert parallelism with an all-to-all token dispatcher and combiner (Megatron-LM's
    ``alltoall`` dispatcher, DeepSpeed-MoE): ``(s/c, b, h) -> (s/c, b, h)``.

    Activations are sharded along the sequence (dim 0) and every rank routes its own tokens
    with the replicated router over all experts. Dispatch is capacity-based with a capacity of
    every local token per expert (nothing is dropped, so the shapes are static and the baseline
    is the same code at degree 1): slot t of expert e holds token t when it chose e, zeros
    otherwise. An all-to-all sends expert e's slots to the rank owning e (contiguous blocks of
    ``experts / c``, the ``expert`` plan style), which runs its experts on the tokens of every
    rank; a second all-to-all returns each token's expert outputs to the rank it came from,
    where they are weighted by the gates and summed.
    """

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.experts, self.top_k = experts, top_k
        self.local = ps.shard(experts, "experts")
        self.router = nn.Parameter(torch.empty(experts, hidden))
        self.gate_up = nn.Parameter(torch.empty(self.local, 2 * ffn, hidden))
        self.down = nn.Parameter(torch.empty(self.local, hidden, ffn))

    def routing(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """(T, E) dispatch mask (the top-k experts of each token) and gate weights (softmax over
        the chosen experts, 0 elsewhere); every token's logits are local to its rank."""
        logits = F.linear(rows, self.router)
        lowest = torch.finfo(logits.dtype).min
        top = logits.amax(dim=-1, keepdim=True)
        threshold, remaining = top, logits
        for _ in range(self.top_k - 1):
            remaining = remaining.masked_fill(remaining >= threshold, lowest)
            threshold = remaining.amax(dim=-1, keepdim=True)
        chosen = logits >= threshold
        gates = torch.exp(logits - top).masked_fill(~chosen, 0.0)
        return chosen.to(rows.dtype), gates / gates.sum(dim=-1, keepdim=True)

    def _dispatch(self, slots: Tensor) -> Tensor:
        """(E, T/c, h) slots of this rank's tokens -> (E/c, T, h) slots of this rank's experts."""
        ps = self.ps
        if ps.tp == 1:
            return slots
        if ps.has("moe_a2a_expert_owner"):
            # Experts dealt round-robin (rank j gets experts j, j + c, ...) while the weights
            # are contiguous blocks: every rank runs its weights on another expert's tokens.
            e, t, h = slots.shape
            slots = slots.reshape(self.local, ps.tp, t, h).transpose(0, 1).reshape(e, t, h)  # BUG-SITE: moe_a2a_expert_owner
        return all_to_all(slots, 0, 1, ps.groups)

    def forward(self, x: Tensor) -> Tensor:
        s, b, h = x.shape
        rows = x.reshape(s * b, h)
        mask, gates = self.routing(rows)  # (T/c, E)
        slots = self._dispatch(rows.unsqueeze(0) * mask.t().unsqueeze(-1))  # (E/c, T, h)
        gate, up = torch.einsum("eth,efh->etf", slots, self.gate_up).chunk(2, dim=-1)
        y = torch.einsum("etf,ehf->eth", F.silu(gate) * up, self.down)  # (E/c, T, h)
        if self.ps.tp > 1:
            y = all_to_all(y, 1, 0, self.ps.groups)  # combine: (E, T/c, h), this rank's tokens
        return (y * gates.t().unsqueeze(-1)).sum(dim=0).reshape(s, b, h)
