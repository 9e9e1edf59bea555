"""What a repository writes to declare a torch-xla SPMD test model (no torch import here).

An entry point (``module:function`` in a ``framework: torch-xla-spmd`` ``.shardproof.yml``) is
called with an :class:`SpmdContext` and returns an :class:`SpmdModel`::

    from shardproof.engine.frontend.spmd.declare import SpmdContext, SpmdInput, SpmdModel

    def tp_mlp(ctx: SpmdContext) -> SpmdModel:
        mesh = ctx.mesh({"tp": 4})                       # a torch_xla.distributed.spmd.Mesh
        return SpmdModel(
            baseline=mlp, distributed=mlp, mesh=mesh,
            inputs=[SpmdInput("x", (8, 64)), SpmdInput("w1", (64, 256), spec=(None, "tp")),
                    SpmdInput("w2", (256, 64), spec=("tp", None))],
        )

Both functions take the inputs as tensors. ``baseline`` runs on one device without any
annotation; ``distributed`` runs on the mesh's virtual CPU devices with every input annotated
by its ``spec`` (as ``xs.mark_sharding`` would annotate it; it may mark intermediates itself
with ``ctx.mesh``'s mesh), and XLA's SPMD partitioner writes the per-device program that is
verified. Specs and the relations derived from them are read as in the JAX front end
(frontend/jax/declare.py): a dim split over the group axes (default: every mesh axis) is
``sharded``, a dim split over other axes is local to the group, anything else ``duplicate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..jax.declare import JaxContext, JaxInput, Spec

SpmdInput = JaxInput  # name, shape, dtype, spec, int_range: the same declaration as for JAX


@dataclass
class SpmdModel:
    baseline: Callable[..., Any]
    distributed: Callable[..., Any]
    mesh: Any  # torch_xla.distributed.spmd.Mesh, from SpmdContext.mesh
    inputs: Sequence[JaxInput]
    # One spec per output tensor (default: every output replicated over the group).
    outputs: Sequence[Spec] | None = None
    group_axes: tuple[str, ...] | None = None
    description: str = ""


class SpmdContext(JaxContext):
    """``variant``: the model's ``variant:`` flag; ``devices``: the virtual CPU devices of the
    build; size knobs through :meth:`knob` (JAX's context, with torch-xla's mesh)."""

    def mesh(self, axes: Mapping[str, int]) -> Any:
        """An SPMD mesh over the first devices in order (partition p is device p)."""
        import numpy as np
        import torch_xla.distributed.spmd as xs

        n = self.mesh_size(axes)
        return xs.Mesh(np.arange(n), tuple(axes.values()), tuple(axes))
