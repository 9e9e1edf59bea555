"""Bug variants: monkeypatches of megatron-core applied in the distributed build only.

Each reproduces a real class of tensor-parallel bug without editing Megatron's files; the
verifier must report it at the Megatron line where the program goes wrong.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.tensor_parallel import layers, mappings


def apply(variant: str | None, rank: int) -> None:
    if variant is None:
        return
    if variant not in PATCHES:
        raise ValueError(f"unknown bug variant {variant!r}; known: {', '.join(sorted(PATCHES))}")
    PATCHES[variant](rank)


def _missing_all_reduce(rank: int) -> None:
    """RowParallelLinear forgets to sum the partial products (the reduction is an identity)."""
    layers.reduce_from_tensor_model_parallel_region = lambda input_, group=None: input_


def _redundant_all_reduce(rank: int) -> None:
    """RowParallelLinear all-reduces its output twice (a second reduction of a full sum)."""
    original = layers.reduce_from_tensor_model_parallel_region
    layers.reduce_from_tensor_model_parallel_region = lambda input_, group=None: original(original(input_, group), group)


def _wrong_vocab_offset(rank: int) -> None:
    """Rank 2 starts its vocabulary block one id too late (an off-by-one in one rank's range)."""
    original = layers.VocabUtility.vocab_range_from_per_partition_vocab_size

    def shifted(per_partition: int, r: int, world: int) -> Any:
        first, last = original(per_partition, r, world)
        return (first + 1, last + 1) if r == 2 else (first, last)

    layers.VocabUtility.vocab_range_from_per_partition_vocab_size = staticmethod(shifted)


def _wrong_group(rank: int) -> None:
    """The row-parallel reduction runs over the data-parallel group instead of the TP group."""
    from megatron.core import parallel_state

    original = mappings._reduce
    layers.reduce_from_tensor_model_parallel_region = lambda input_, group=None: original(input_, parallel_state.get_data_parallel_group())


def _sp_gather_dim(rank: int) -> None:
    """The sequence-parallel all-gather before the column-parallel matmul concatenates the
    ranks' pieces along the hidden dim and reads the result back as (s, b, h): the gathered
    activations are scrambled."""

    def gather_wrong_dim(output: torch.Tensor, input_: torch.Tensor, group: Any = None) -> None:
        output.copy_(mappings._gather_along_last_dim(input_, group).reshape(output.shape))

    layers.dist_all_gather_func = gather_wrong_dim


def _precision(rank: int) -> None:
    """The row-parallel partial sums are all-reduced in bf16 (a lossy cast before the sum)."""
    original = mappings._reduce

    def reduce_bf16(input_: Any, group: Any = None) -> Any:
        return original(input_.to(torch.bfloat16), layers.get_tensor_model_parallel_group_if_none(group)).to(input_.dtype)

    layers.reduce_from_tensor_model_parallel_region = reduce_bf16


def _ce_missing_max_all_reduce(rank: int) -> None:
    """vocab_parallel_cross_entropy skips the all-reduce(MAX) of logits_max: each rank
    subtracts its own local max, so the shifted logits of different ranks do not agree."""
    original = torch.distributed.all_reduce

    def all_reduce(tensor: torch.Tensor, op: Any = torch.distributed.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
        if op == torch.distributed.ReduceOp.MAX:
            return None
        return original(tensor, op=op, group=group, async_op=async_op)

    torch.distributed.all_reduce = all_reduce


PATCHES = {
    "missing_all_reduce": _missing_all_reduce,
    "redundant_all_reduce": _redundant_all_reduce,
    "wrong_vocab_offset": _wrong_vocab_offset,
    "wrong_group": _wrong_group,
    "sp_gather_dim": _sp_gather_dim,
    "precision": _precision,
    "ce_missing_max_all_reduce": _ce_missing_max_all_reduce,
}
