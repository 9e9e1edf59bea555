"""What a JAX repository writes to declare a test model (no jax import here).

An entry point (``module:function`` in a ``framework: jax`` ``.shardproof.yml``) is called with a
:class:`JaxContext` and returns a :class:`JaxModel`::

    from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel

    def tp_mlp(ctx: JaxContext) -> JaxModel:
        mesh = ctx.mesh({"tp": 4})
        return JaxModel(
            baseline=mlp,                                   # the single-device function
            distributed=shard_map(mlp_tp, mesh=mesh, in_specs=..., out_specs=P()),
            mesh=mesh,
            inputs=[JaxInput("x", (8, 64)), JaxInput("w1", (64, 256), spec=(None, "tp")),
                    JaxInput("w2", (256, 64), spec=("tp", None))],
        )

``distributed`` is either a ``shard_map`` (written per device, collectives by hand) or a plain
function that XLA's SPMD partitioner splits (``gspmd=True``: it is jitted with the inputs'
shardings and ``out_shardings`` from the output specs). Input and output ``spec``s are
PartitionSpec entries, one per dim (``None``, an axis name or a tuple of names). The front end
derives the relations from them: the rank groups are the devices along ``group_axes`` (default:
every mesh axis), a dim split over the group axes is ``sharded`` along it, a dim split over
other axes (data parallel) is local to the group (the baseline receives one group's part),
anything else is ``duplicate``.

``inputs`` are the positional arguments as the code has them, each a pytree (trees.py): flax
linen ``variables`` straight from ``jax.eval_shape(model.init, ...)`` (their
``with_logical_partitioning`` / ``with_partitioning`` boxes give the specs), an nnx module or
state (``nnx.with_partitioning`` metadata), an optax state built from boxed parameters, arrays
or ``jax.ShapeDtypeStruct``s with ``NamedSharding``s, or :class:`JaxInput`s. Logical axis names
map to mesh axes through ``rules`` (flax's ``logical_axis_rules`` form); the distributed
function is traced with the mesh and those rules in force, so ``nn.with_logical_constraint``
in the model's code takes effect there (and is a no-op in the single-device baseline)::

    def flax_mlp(ctx: JaxContext) -> JaxModel:
        mesh = ctx.mesh({"data": 2, "model": 2})
        model = MLP()
        x = JaxInput("x", (8, 64), spec=("batch", None))
        variables = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct((8, 64), "float32"))
        return JaxModel(model.apply, model.apply, mesh, [variables, x], gspmd=True,
                        rules=[("batch", "data"), ("mlp", "model")], group_axes=("model",),
                        outputs=[("batch", None)])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Spec = tuple[Any, ...]


@dataclass(frozen=True)
class JaxInput:
    """One positional input: its global shape and dtype, its sharding spec over the mesh, and
    for integer inputs the range of values [lo, hi) (token ids)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    spec: Spec = ()
    int_range: tuple[int, int] | None = None
    # Model state (a weight): one value for every data-parallel group; a dim split over a
    # non-group axis is then FSDP, gathered whole inside the program (flax boxes are state).
    state: bool = False


@dataclass
class JaxModel:
    baseline: Callable[..., Any]
    distributed: Callable[..., Any]
    mesh: Any
    # The positional arguments: each a JaxInput or a pytree of them, of arrays, of
    # ShapeDtypeStructs or of flax-boxed arrays (see the module's doc).
    inputs: Sequence[Any]
    # One spec per output leaf, or a pytree of PartitionSpecs shaped like the output (default:
    # every output replicated over the group).
    outputs: Any = None
    group_axes: tuple[str, ...] | None = None
    gspmd: bool = False
    description: str = ""
    # Logical axis rules, ((logical name, mesh axis | tuple of axes | None), ...): how the
    # logical names of input/output specs and of flax boxes map to the mesh (default: the
    # boxes' own rules, else flax's rules in force at build time).
    rules: Sequence[tuple[str, Any]] | None = None
    # The positional arguments that are model state (default: those leaves that are flax boxes
    # or JaxInputs with state=True): a dim split over a non-group axis is FSDP there.
    state: Sequence[int] | None = None


@dataclass
class JaxContext:
    """``variant``: the model's ``variant:`` flag (a bug's name, or None); ``devices``: the
    number of (virtual CPU) devices the build has; size knobs through :meth:`knob`."""

    name: str
    devices: int
    variant: str | None = None
    size: Mapping[str, Any] = field(default_factory=dict)
    _read: set[str] = field(default_factory=set, repr=False)

    def knob(self, key: str, default: Any) -> Any:
        self._read.add(key)
        value = self.size.get(key, default)
        if type(value) is not type(default) and not (isinstance(default, float) and isinstance(value, int)):
            raise ValueError(f"size.{key}: expected {type(default).__name__} like {default!r}, got {value!r}")
        return value

    def unread_knobs(self) -> list[str]:
        return sorted(set(self.size) - self._read)

    def mesh_size(self, axes: Mapping[str, int]) -> int:
        """How many devices a mesh of ``axes`` takes; an error when the build has fewer."""
        n = 1
        for s in axes.values():
            n *= s
        if n > self.devices:
            raise ValueError(f"a mesh of {n} devices, but the build has {self.devices} (set devices: in .shardproof.yml)")
        return n

    def mesh(self, axes: Mapping[str, int]) -> Any:
        """A mesh over the first devices, in device order (partition p is device p)."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        n = self.mesh_size(axes)
        return Mesh(np.array(jax.devices()[:n]).reshape(tuple(axes.values())), tuple(axes))
