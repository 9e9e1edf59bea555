"""Bug variants of examples/torchdist, patched into fairscale in the distributed build only (a
regression in a fork of fairscale would reach only the sharded program). This file is in
``hide_frames``: an op a patch adds is reported at the fairscale line that calls it."""

from __future__ import annotations

import torch
from fairscale.nn.model_parallel import initialize, layers, utils


def _no_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


class _ReversedVocab(utils.VocabUtility):
    @staticmethod
    def vocab_range_from_global_vocab_size(global_vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
        return utils.VocabUtility.vocab_range_from_global_vocab_size(global_vocab_size, world_size - 1 - rank, world_size)


def _gather_reversed(x: torch.Tensor) -> torch.Tensor:
    """fairscale's list-form gather along the last dim with the pieces joined from the last
    rank to the first: each rank's columns land in another rank's place."""
    group = initialize.get_model_parallel_group()
    world = torch.distributed.get_world_size(group=group)
    if world == 1:
        return x
    pieces = [torch.empty_like(x) for _ in range(world)]
    torch.distributed.all_gather(pieces, x, group=group)
    return torch.cat(pieces[::-1], dim=x.dim() - 1).contiguous()


def apply(variant: str | None) -> None:
    if variant == "missing_reduce":
        # RowParallelLinear adds its bias to a partial sum: the all-reduce is gone
        layers.reduce_from_model_parallel_region = _no_reduce
    elif variant == "vocab_range_reversed":
        # VocabParallelEmbedding masks the ids of another rank's rows (its range computed for
        # rank c - 1 - r) while it holds rank r's rows
        layers.VocabUtility = _ReversedVocab
    elif variant == "gather_reversed":
        # ParallelEmbedding joins the gathered column blocks in reverse rank order
        layers.gather_from_model_parallel_region = _gather_reversed
    elif variant is not None:
        raise ValueError(f"unknown variant {variant!r}")
