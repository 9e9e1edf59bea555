"""Relations from DTensor placements (no ``plan:`` to write).

A DTensor on a device mesh carries one placement per mesh dim: ``Shard(d)`` (the rank holds
the r-th of the mesh dim's ``n`` pieces of dim ``d``, ``torch.chunk`` order), ``Replicate()``
(every rank of the mesh dim holds all of it) or ``Partial(op)`` (reducing the ranks' tensors
with ``op`` gives it). The verifier relates a rank's tensor to the baseline over one partition
of the ranks, the model's ``groups``; so exactly one mesh dim may be other than replicated, and
its groups must be the model's groups (this rank's group along that dim is checked: the
meshes are SPMD, every rank builds the same mesh). Everything else is a declaration error that
names the tensor, its placements and both shapes:

- a ``Shard(d)`` whose dim does not divide over the mesh dim (DTensor pads unevenly: the ranks
  would hold different extents, which no relation describes);
- a sharding over a mesh dim whose groups are not the model's (a ``(dp, tp)`` mesh with the
  model declared over the dp groups, or a mesh of a shape the configuration did not declare);
- shards over two mesh dims at once other than FSDP x TP (a shard over one mesh dim outside
  the model's groups, of another dim than the model's shard: the relation is ``gathered`` over
  that mesh dim's groups), or a ``Partial`` parameter: no relation of the verifier holds them
  (a strided shard, ``_StridedShard(d, split_factor=k)``, over the one sharding mesh dim is the
  ``blocks`` relation: k equal blocks of dim d, each sharded);
- a local shape that is not the baseline's shape cut by the placement.

This module is pure: the host (``host.py``) reads the placements off the DTensors into
:class:`Placed` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..plan import ParamRelation


class PlacementError(ValueError):
    """A placement that no relation describes, or that does not fit the shapes or groups."""


@dataclass(frozen=True)
class Placed:
    """One DTensor's placements on its mesh, as the host read them on one rank.

    ``placements[i]`` is ``("shard", d)``, ``("replicate", None)`` or ``("partial", None)``
    (``reduce`` then names its op); ``groups[i]`` the global ranks of this rank's group along
    mesh dim ``i``; ``names[i]`` the mesh dim's name (or its index as text).
    """

    placements: tuple[tuple[str, int | None], ...]
    groups: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    text: str  # the placements as DTensor prints them, for messages and relations.yaml
    reduce: str = "sum"
    # A strided shard (``_StridedShard(d, split_factor=k)``, transformers' packed gate/up): dim d
    # is k equal blocks, each sharded on its own, and a rank holds its piece of each, in order.
    split: int = 1
    # Every group of each mesh dim (``groups`` holds this rank's only): an FSDP mesh dim's
    # groups are the ``gathered`` groups of the relation.
    all_groups: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def describe(self) -> str:
        mesh = ", ".join(f"{n}={len(g)}" for n, g in zip(self.names, self.groups, strict=True))
        return f"{self.text} on mesh ({mesh})"


def _model_group(groups: Sequence[Sequence[int]], rank_group: tuple[int, ...]) -> bool:
    return any(tuple(g) == rank_group for g in groups)


def _sharding_dim(what: str, placed: Placed, groups: Sequence[Sequence[int]]) -> int | None:
    """The mesh dim that is not replicated (None: replicated everywhere), checked."""
    active = [i for i, (kind, _) in enumerate(placed.placements) if kind != "replicate" and len(placed.groups[i]) > 1]
    if len(active) > 1:
        dims = ", ".join(placed.names[i] for i in active)
        raise PlacementError(f"{what} is {placed.describe()}: sharded or partial over mesh dims {dims} at once; the verifier relates a tensor over one group of ranks (the model's groups), so at most one mesh dim may be other than Replicate()")
    if not active:
        return None
    i = active[0]
    if not _model_group(groups, placed.groups[i]):
        raise PlacementError(
            f"{what} is {placed.describe()}: mesh dim {placed.names[i]!r} groups ranks {list(placed.groups[i])}, "
            f"which is not a group of the model ({[list(g) for g in groups]}); declare tp/groups in .shardproof.yml as the mesh dim the model is parallelized over"
        )
    return i


def _fsdp_dim(placed: Placed, groups: Sequence[Sequence[int]]) -> int | None:
    """The mesh dim of FSDP on top of the model's sharding: a mesh dim outside the model's
    groups that is sharded, next to (at most) one mesh dim of the model's groups."""
    active = [i for i, (kind, _) in enumerate(placed.placements) if kind != "replicate" and len(placed.groups[i]) > 1]
    outside = [i for i in active if not _model_group(groups, placed.groups[i])]
    if len(outside) != 1 or len(active) - len(outside) > 1 or not placed.all_groups or placed.placements[outside[0]][0] != "shard":
        return None
    return outside[0]


def param_relation(name: str, placed: Placed, full: tuple[int, ...], local: tuple[int, ...], groups: Sequence[Sequence[int]]) -> ParamRelation:
    """The relation of parameter ``name`` (baseline ``full``, per-rank ``local``) from its placements.

    FSDP x TP (a ``(dp, tp)`` mesh, ``Shard(e)`` over dp and the model's sharding over tp): the
    relation of the tp placement, ``gathered`` along e over the dp groups: each device holds its
    tp piece cut in blocks along e, and the program's all-gather over dp restores the piece."""
    what = f"parameter {name!r}"
    j = _fsdp_dim(placed, groups)
    if j is not None:
        e = placed.placements[j][1]
        assert e is not None
        k = len(placed.groups[j])
        model = replace(placed, placements=tuple(("replicate", None) if i == j else p for i, p in enumerate(placed.placements)))
        tp = [(kind, d) for kind, d in model.placements if kind != "replicate"]
        if tp and tp[0] == ("shard", e):
            raise PlacementError(f"{what} is {placed.describe()}: sharded along dim {e} over mesh dims {placed.names[j]!r} and the model's at once; DTensor nests the {placed.names[j]!r} cut outside the other, while a gathered relation holds each rank's piece cut further (shard another dim over {placed.names[j]!r}, or use a strided shard)")
        if placed.split > 1:
            raise PlacementError(f"{what} is {placed.describe()}: a strided shard next to FSDP's shard has no relation here")
        if not 0 <= e < len(local):
            raise PlacementError(f"{what} is {placed.describe()} but has {len(local)} dim(s) per rank ({list(local)})")
        whole = tuple(n * k if i == e else n for i, n in enumerate(local))
        try:
            rel = param_relation(name, model, full, whole, groups)
        except PlacementError as err:
            raise PlacementError(f"{err} once its {k} blocks along dim {e} are gathered over {placed.names[j]!r} (it holds {list(local)})") from None
        if rel.relation != "sharded" and rel.relation != "duplicate":
            raise PlacementError(f"{what} is {placed.describe()}: FSDP over a {rel.relation} relation has no relation here")
        return replace(rel, gathered=(e, placed.all_groups[j]), source=f"placement {placed.describe()}, gathered over {placed.names[j]!r}")
    i = _sharding_dim(what, placed, groups)
    source = f"placement {placed.describe()}"
    if i is None:
        if full != local:
            raise PlacementError(f"{what} is {placed.describe()} (replicated) but is {list(full)} in the baseline and {list(local)} per rank")
        return ParamRelation("duplicate", source=source)
    kind, dim = placed.placements[i]
    if kind == "partial":
        raise PlacementError(f"{what} is {placed.describe()}: a parameter held as a partial {placed.reduce} over ranks has no relation here (expected Shard(d) or Replicate())")
    assert dim is not None
    c = len(placed.groups[i])
    if not 0 <= dim < len(full):
        raise PlacementError(f"{what} is {placed.describe()} but has {len(full)} dim(s) in the baseline ({list(full)})")
    if full[dim] % c:
        raise PlacementError(f"{what} is {placed.describe()}: dim {dim} of the baseline's {list(full)} ({full[dim]}) does not divide over the {c} ranks of mesh dim {placed.names[i]!r} (DTensor would give the ranks unequal pieces)")
    blocks: tuple[int, ...] = ()
    if placed.split > 1:
        if full[dim] % (placed.split * c):
            raise PlacementError(f"{what} is {placed.describe()}: dim {dim} of the baseline's {list(full)} ({full[dim]}) is not {placed.split} blocks that each divide over the {c} ranks")
        blocks = (full[dim] // placed.split,) * placed.split
    want = tuple(n // c if k == dim else n for k, n in enumerate(full))
    if local != want:
        raise PlacementError(f"{what} is {placed.describe()}, so each rank should hold {list(want)} of the baseline's {list(full)}, but it holds {list(local)}")
    return ParamRelation("sharded", dim, blocks, source)


def output_relation(index: int, placed: Placed, full: tuple[int, ...], local: tuple[int, ...], groups: Sequence[Sequence[int]]) -> dict[str, object]:
    """The expected relation of output ``index`` (a DTensor the program returned)."""
    what = f"output {index}"
    i = _sharding_dim(what, placed, groups)
    if i is None:
        if full != local:
            raise PlacementError(f"{what} is {placed.describe()} (replicated) but is {list(full)} in the baseline and {list(local)} per rank")
        return {"relation": "duplicate"}
    kind, dim = placed.placements[i]
    if kind == "partial":
        if placed.reduce != "sum":
            raise PlacementError(f"{what} is {placed.describe()}: only a partial sum has a relation here, not a partial {placed.reduce}")
        return {"relation": "partial"}
    assert dim is not None
    c = len(placed.groups[i])
    want = tuple(n // c if k == dim else n for k, n in enumerate(full)) if 0 <= dim < len(full) and full[dim] % c == 0 else None
    if local != want:
        raise PlacementError(f"{what} is {placed.describe()}: each rank should hold {list(want) if want else 'an equal piece'} of the baseline's {list(full)}, but it holds {list(local)}")
    return {"relation": "sharded", "dim": dim}


def input_relation(name: str, placed: Placed, full: tuple[int, ...], shard: int | None, blocks: tuple[int, ...], derive: bool, groups: Sequence[Sequence[int]]) -> int | None:
    """The dim input ``name`` (baseline ``full``) is sharded along (None: replicated), checked
    against the placements a ``DTensor.from_local`` of it gives (the rank's tensor as DTensor
    takes it). ``shard``/``blocks`` are what the declaration says; with ``derive`` (no plan
    written and no ``shard`` given) the placement decides instead. A disagreement is a
    declaration error: DTensor would read each rank's tensor as something it is not (a piece as
    the whole tensor, or the whole tensor as a piece of one c times larger)."""
    what = f"input {name!r}"
    declared = "declared replicated (Input without shard=)" if shard is None else f"declared Input(shard={shard}" + (f", blocks={list(blocks)}" if blocks else "") + ")"
    try:
        i = _sharding_dim(what, placed, groups)
    except PlacementError as e:
        raise PlacementError(f"{e}; it is {declared}") from None
    where = f"DTensor.from_local places it {placed.describe()}"
    if i is None:
        if shard is None:
            return None
        raise PlacementError(f"{what} is {declared}, so each rank holds a piece of the baseline's {list(full)}, but {where}: replicated, so DTensor takes each rank's piece for the whole tensor; declare it without shard= or place it Shard({shard})")
    kind, dim = placed.placements[i]
    if kind == "partial":
        raise PlacementError(f"{what} is {declared}, but {where}: an input held as partial sums has no relation here (expected Shard(d) or Replicate())")
    assert dim is not None
    if shard is None:
        if derive:
            return dim
        raise PlacementError(f"{what} is {declared} (every rank holds all of {list(full)}), but {where}: DTensor takes each rank's whole tensor for one of {len(placed.groups[i])} pieces along dim {dim}; declare Input(shard={dim}) or place it Replicate()")
    placed_blocks = (full[dim] // placed.split,) * placed.split if placed.split > 1 and 0 <= dim < len(full) else ()
    if dim != shard or tuple(blocks) != placed_blocks:
        raise PlacementError(f"{what} is {declared}, but {where}: each rank's tensor is another piece of it than declared; declare Input(shard={dim}" + (f", blocks={list(placed_blocks)}" if placed_blocks else "") + ") or fix the placement")
    return shard
