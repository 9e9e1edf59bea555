"""Inputs as JAX code has them: pytrees of arrays whose shardings come from the leaves.

A model's ``inputs`` are its positional arguments, each a pytree (a flax linen ``variables``
dict, an nnx module or state, an optax state, a tuple of arrays, a single :class:`JaxInput`).
Its leaves say their shape, dtype and sharding in the forms real code writes them:

- :class:`JaxInput`: shape, dtype, ``spec`` (mesh axes, or logical names with ``rules``);
- ``jax.ShapeDtypeStruct`` or an array, with a ``NamedSharding`` (its spec) or none (replicated);
- flax linen boxes: ``nn.Partitioned`` (``with_partitioning``: mesh axes) and
  ``nn.LogicallyPartitioned`` (``with_logical_partitioning``: logical names, mapped through the
  model's ``rules``, the box's own rules, or ``nn.logical_axis_rules`` in force at build time);
  ``nn.scan`` stacks them with its ``metadata_params`` axis name, as in the model;
- nnx variables (``nnx.with_partitioning``): the ``out_sharding`` / ``sharding`` metadata,
  logical names mapped like linen's.

The pytree is walked once, each box as one node, so the flattened leaves keep jit's parameter
order in both programs. The logical-to-mesh mapping is flax's own
(``flax.linen.logical_to_mesh_axes``: the first rule whose mesh axes are still free wins; a name
without a rule is replicated), so the relations say what flax itself would shard.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .declare import JaxInput, Spec


class TreeError(ValueError):
    """A leaf whose shape, dtype or sharding cannot be read: a mistake in the declaration."""


@dataclass(frozen=True)
class Leaf:
    """One array input: its pytree path, global shape and dtype, mesh-axis spec, id range."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    spec: Spec
    int_range: tuple[int, int] | None = None
    # Model state (a weight, an optimizer moment): one value for every data-parallel group, so
    # a dim split over a non-group axis is FSDP (gathered inside the program), not the group's
    # part of a batch.
    state: bool = False


def _is_box(x: Any) -> bool:
    """A node that stands for one array with sharding metadata (flax linen or nnx)."""
    if isinstance(x, JaxInput):
        return True
    # A flax box exists only once the model's code imported flax: never import it here (it
    # is optional, and costs seconds in every build of a model that does not use it).
    if "flax" not in sys.modules:
        return False
    from flax import nnx
    from flax.core import meta

    return isinstance(x, meta.AxisMetadata | nnx.Variable)


def _path_text(path: Sequence[Any]) -> str:
    """``args[0].params.Dense_0.kernel``: the pytree path, as a user reads it."""
    out = ""
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                v = getattr(k, attr)
                out += f"[{v}]" if isinstance(v, int) else f".{v}"
                break
        else:
            out += f".{k}"
    return out


def map_axes(names: Sequence[Any], rules: Sequence[tuple[str, Any]] | None, mesh_axes: Sequence[str], what: str) -> Spec:
    """A spec of logical names (or mesh axes) as mesh axes: flax's own mapping when a name is
    not an axis of the mesh."""
    logical = [n for n in names if isinstance(n, str) and n not in mesh_axes]
    if not logical:
        return tuple(names)
    if not rules:
        raise TreeError(f"{what}: logical axis name(s) {', '.join(map(repr, logical))} are not axes of the mesh {tuple(mesh_axes)} and no logical axis rules are given (JaxModel(rules=...) or nn.logical_axis_rules)")
    from flax.linen import logical_to_mesh_axes

    plain = [n if (not isinstance(n, str) or n not in mesh_axes) else None for n in names]
    mapped = list(logical_to_mesh_axes(plain, list(rules)))
    # A mesh axis written directly stays where it is (flax's rules only name logical axes).
    return tuple(n if isinstance(n, str) and n in mesh_axes else m for n, m in zip(names, mapped, strict=True))


def _spec_of_sharding(sharding: Any, mesh: Any, what: str) -> Spec:
    from jax.sharding import NamedSharding

    if sharding is None:
        return ()
    if not isinstance(sharding, NamedSharding):
        if getattr(sharding, "is_fully_replicated", False):
            return ()
        raise TreeError(f"{what}: sharding {sharding} is not a NamedSharding over the model's mesh")
    if tuple(sharding.mesh.axis_names) != tuple(mesh.axis_names) or dict(sharding.mesh.shape) != dict(mesh.shape):
        raise TreeError(f"{what}: its NamedSharding is over the mesh {dict(sharding.mesh.shape)}, not the model's {dict(mesh.shape)}")
    return tuple(sharding.spec)


def _abstract(x: Any, what: str) -> tuple[tuple[int, ...], Any]:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise TreeError(f"{what}: expected an array, a jax.ShapeDtypeStruct or a JaxInput, got {type(x).__name__}")
    return tuple(int(s) for s in shape), dtype


def _box_leaf(box: Any, name: str, mesh: Any, rules: Sequence[tuple[str, Any]] | None) -> tuple[Leaf, Callable[[Any], Any]]:
    """The leaf a box stands for, and how to rebuild the box around a new value."""
    import jax

    if isinstance(box, JaxInput):
        spec = map_axes(tuple(box.spec), rules, mesh.axis_names, name)
        return Leaf(name, tuple(box.shape), box.dtype, spec, box.int_range, box.state), lambda v: v
    values, treedef = jax.tree_util.tree_flatten(box)
    if len(values) != 1:
        raise TreeError(f"{name}: a partitioned box holds {len(values)} arrays, expected one")
    shape, dtype = _abstract(values[0], name)
    names: Sequence[Any] | None = None
    own_rules = None
    from flax.core import meta

    if isinstance(box, meta.AxisMetadata):
        names = getattr(box, "names", None)
        own_rules = getattr(box, "rules", None)
    else:  # nnx.Variable: flax 0.12 writes out_sharding, older releases sharding / sharding_names
        md = box.get_metadata()
        for key in ("out_sharding", "sharding_names", "sharding"):
            if md.get(key) is not None:
                names = md[key]
                break
        own_rules = md.get("sharding_rules")
    if names is None:
        spec = _spec_of_sharding(getattr(values[0], "sharding", None), mesh, name)
    else:
        if len(names) != len(shape):
            raise TreeError(f"{name}: partition names {tuple(names)} for an array of shape {shape}")
        spec = map_axes(tuple(names), rules if rules is not None else own_rules, mesh.axis_names, name)
    return Leaf(name, shape, dtype, spec, state=True), lambda v: jax.tree_util.tree_unflatten(treedef, [v])


def flatten(args: Sequence[Any], mesh: Any, rules: Sequence[tuple[str, Any]] | None, state: Sequence[int] | None = None) -> tuple[list[Leaf], Callable[[list[Any]], tuple[Any, ...]]]:
    """The array leaves of the positional arguments in jit's order, and a function that rebuilds
    the arguments with new leaf values (boxes and modules kept around them). ``state``: the
    positional arguments that are model state (default: flax boxes and JaxInputs marked so)."""
    import dataclasses

    import jax

    nodes, treedef = jax.tree_util.tree_flatten_with_path(tuple(args), is_leaf=_is_box)
    leaves: list[Leaf] = []
    rebuild: list[Callable[[Any], Any]] = []
    for path, node in nodes:
        # A JaxInput names itself; anything else by its path in the arguments.
        name = node.name if isinstance(node, JaxInput) else "args" + _path_text(path)
        if _is_box(node):
            leaf, wrap = _box_leaf(node, name, mesh, rules)
        else:
            shape, dtype = _abstract(node, name)
            leaf, wrap = Leaf(name, shape, dtype, _spec_of_sharding(getattr(node, "sharding", None), mesh, name)), (lambda v: v)
        if state is not None:
            leaf = dataclasses.replace(leaf, state=getattr(path[0], "idx", None) in state)
        leaves.append(leaf)
        rebuild.append(wrap)

    def build(values: list[Any]) -> tuple[Any, ...]:
        return tuple(jax.tree_util.tree_unflatten(treedef, [w(v) for w, v in zip(rebuild, values, strict=True)]))

    return leaves, build


def output_specs(outputs: Any, n_out: int, mesh: Any, rules: Sequence[tuple[str, Any]] | None) -> list[Spec]:
    """One mesh-axis spec per output leaf: ``outputs`` is None (all replicated), a list with one
    spec per leaf, or a pytree shaped like the output whose leaves are PartitionSpecs, flax
    boxes or arrays with their shardings (a train step returns its parameters and optimizer
    state sharded as they came in: pass the input trees themselves)."""
    import jax
    from jax.sharding import PartitionSpec

    if outputs is None:
        return [()] * n_out

    def is_spec(x: Any) -> bool:
        return x is None or isinstance(x, PartitionSpec) or (type(x) is tuple and all(e is None or isinstance(e, str) or (isinstance(e, tuple) and all(isinstance(a, str) for a in e)) for e in x))

    if isinstance(outputs, list) and len(outputs) == n_out and all(is_spec(s) for s in outputs):
        specs = list(outputs)
    else:
        specs = jax.tree_util.tree_leaves(outputs, is_leaf=lambda x: is_spec(x) or _is_box(x))
    if len(specs) != n_out:
        raise TreeError(f"{len(specs)} output specs for {n_out} outputs")
    out = []
    for k, s in enumerate(specs):
        if is_spec(s):
            out.append(map_axes(tuple(s or ()), rules, mesh.axis_names, f"output {k}"))
        elif _is_box(s):
            out.append(_box_leaf(s, f"output {k}", mesh, rules)[0].spec)
        else:
            _abstract(s, f"output {k}")
            out.append(_spec_of_sharding(getattr(s, "sharding", None), mesh, f"output {k}"))
    return out
