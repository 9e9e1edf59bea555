"""A regression patched into PyTorch's RowwiseParallel, in the distributed build only.

``dropped_reduction``: a fork's RowwiseParallel output hook hands the partial sums of the
row-parallel matmul to the caller as they are (``to_local()`` without the redistribute to the
declared output layout), the way a patch that "skips a redundant all-reduce" would.

``unscaled_partial``: a fork's ``Partial`` turns a replicated tensor into partial sums by
handing every rank the whole value (the division by the group size dropped): a replicated
bias added to a row-parallel matmul's partial sums is then counted once per rank.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import RowwiseParallel


def _output_without_reduction(output_layouts: Any, use_local_output: bool, mod: Any, outputs: Any, device_mesh: Any) -> Any:
    return outputs.to_local() if use_local_output else outputs  # BUG-SITE: dropped_reduction


def _partition_unscaled(self: Any, tensor: Any, mesh: Any, mesh_dim: int) -> Any:
    return tensor  # BUG-SITE: unscaled_partial


def apply(variant: str | None) -> None:
    if variant == "dropped_reduction":
        RowwiseParallel._prepare_output_fn = staticmethod(_output_without_reduction)  # type: ignore[method-assign]
    if variant == "unscaled_partial":
        Partial._partition_value = _partition_unscaled  # type: ignore[method-assign]
