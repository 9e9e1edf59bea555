"""Parallel state and the communication primitives of tplm.

Every primitive is the identity when the degree is 1, as in Megatron-LM: the baseline is the
same model code run with ``Parallel(tp=1)`` and contains no collective. The autograd functions
pair each forward collective with its conjugate in the backward pass (f/g of the Megatron
paper): copy-to-region all-reduces gradients, reduce-from-region passes them through,
all-gather along the sequence reduce-scatters them and vice versa.

The collectives are torch-xla's token-free ops (``_xla_spmd_all_reduce``,
``_xla_spmd_reduce_scatter``, ``_xla_all_gather`` with ``pin_layout=False``), which lower to
plain ``all-reduce`` / ``reduce-scatter`` / ``all-gather`` over explicit replica groups. This
file is listed under ``hide_frames`` in ``.shardproof.yml``: an instruction created here is
reported at the model line that asked for the collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch_xla
from torch import Tensor

Groups = list[list[int]]


@dataclass
class Parallel:
    """Degree, groups and rank of the tensor-parallel group a model runs in.

    ``rank`` is an ``s32[]`` tensor on the distributed side (one program for all ranks) and the
    integer 0 for the baseline. ``sequence_parallel`` keeps activations between blocks sharded
    along the sequence (dim 0 of the ``(s, b, h)`` layout). ``bug`` names a bug variant the
    distributed build reproduces; the baseline never carries one.
    """

    tp: int = 1
    rank: Any = 0
    groups: Groups = field(default_factory=lambda: [[0]])
    sequence_parallel: bool = False
    bug: str | None = None

    def __post_init__(self) -> None:
        if self.tp > 1 and len(self.groups[0]) != self.tp:
            raise ValueError(f"groups {self.groups} do not have {self.tp} ranks each")

    def has(self, bug: str) -> bool:
        return self.bug == bug

    def shard(self, n: int, what: str) -> int:
        if n % self.tp:
            raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel degree {self.tp}")
        return n // self.tp

    def padded(self, n: int) -> int:
        """The per-rank share of n items padded to a multiple of the degree (Neuron's layout
        of heads or FFN features that do not divide): ceil(n / tp); rank r holds items
        [r·w, r·w + w) of the n items followed by zeros."""
        return -(-n // self.tp)


# ---------------------------------------------------------------------------------------------
# Raw collectives (no autograd).


def all_reduce(x: Tensor, groups: Groups, op: str = "sum") -> Tensor:
    return torch_xla._XLAC._xla_spmd_all_reduce(op, x, 1.0, groups)


def all_gather(x: Tensor, dim: int, groups: Groups) -> Tensor:
    return torch_xla._XLAC._xla_all_gather(x, dim, len(groups[0]), groups, False, None, None)


def reduce_scatter(x: Tensor, dim: int, groups: Groups) -> Tensor:
    return torch_xla._XLAC._xla_spmd_reduce_scatter("sum", x, 1.0, dim, len(groups[0]), groups)


def ring_shift(x: Tensor, groups: Groups, shift: int = 1) -> Tensor:
    """Every rank sends ``x`` ``shift`` places along its group's ring (collective-permute)."""
    import torch_xla.core.xla_model as xm

    pairs = [[g[i], g[(i + shift) % len(g)]] for g in groups for i in range(len(g))]
    return xm.collective_permute(x, pairs)


def all_to_all(x: Tensor, split_dim: int, concat_dim: int, groups: Groups) -> Tensor:
    """Rank j receives piece j (along ``split_dim``) of every rank's ``x``, concatenated along
    ``concat_dim`` in rank order (xm.all_to_all; the front end gives it a fresh token)."""
    import torch_xla.core.xla_model as xm

    return xm.all_to_all(x, split_dim, concat_dim, len(groups[0]), groups=groups, pin_layout=False)


# ---------------------------------------------------------------------------------------------
# Conjugate pairs for autograd.


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, groups: Groups) -> Tensor:
        ctx.groups = groups
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return all_reduce(grad, ctx.groups), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, groups: Groups) -> Tensor:
        return all_reduce(x, groups)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, groups: Groups) -> Tensor:
        ctx.groups = groups
        return all_gather(x, 0, groups)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return reduce_scatter(grad, 0, ctx.groups), None


class _ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, groups: Groups) -> Tensor:
        ctx.groups = groups
        return reduce_scatter(x, 0, groups)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return all_gather(grad, 0, ctx.groups), None


def copy_to_region(x: Tensor, ps: Parallel) -> Tensor:
    """Identity forward, all-reduce of the gradient: the input of a column-parallel layer."""
    return _CopyToRegion.apply(x, ps.groups) if ps.tp > 1 else x


def reduce_from_region(x: Tensor, ps: Parallel, groups: Groups | None = None) -> Tensor:
    """All-reduce forward: the output of a row-parallel layer."""
    return _ReduceFromRegion.apply(x, groups or ps.groups) if ps.tp > 1 else x


def gather_sequence(x: Tensor, ps: Parallel) -> Tensor:
    """All-gather along the sequence (sequence parallelism), reduce-scatter of the gradient."""
    return _GatherFromSequence.apply(x, ps.groups) if ps.tp > 1 else x


def reduce_scatter_sequence(x: Tensor, ps: Parallel) -> Tensor:
    """Reduce-scatter along the sequence (sequence parallelism), all-gather of the gradient."""
    return _ReduceScatterToSequence.apply(x, ps.groups) if ps.tp > 1 else x


def gather_last_dim(x: Tensor, ps: Parallel) -> Tensor:
    """All-gather of column-parallel outputs (forward only: used for logits)."""
    return all_gather(x, x.dim() - 1, ps.groups) if ps.tp > 1 else x


def all_reduce_max(x: Tensor, ps: Parallel) -> Tensor:
    return all_reduce(x, ps.groups, "max") if ps.tp > 1 else x


def all_reduce_sum(x: Tensor, ps: Parallel, groups: Groups | None = None) -> Tensor:
    return all_reduce(x, groups or ps.groups) if ps.tp > 1 else x
