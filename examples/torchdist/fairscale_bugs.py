"""Bug variants of examples/torchdist, patched into fairscale in the distributed build only (a
regression in a fork of fairscale would reach only the sharded program). This file is in
``hide_frames``: an op a patch adds is reported at the fairscale line that calls it."""

from __future__ import annotations

import torch
from fairscale.nn.model_parallel import layers


def _no_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


def apply(variant: str | None) -> None:
    if variant == "missing_reduce":
        # RowParallelLinear adds its bias to a partial sum: the all-reduce is gone
        layers.reduce_from_model_parallel_region = _no_reduce
    elif variant is not None:
        raise ValueError(f"unknown variant {variant!r}")
