"""XLA's mesh-axes replica-group list, expanded to explicit groups of device ids.

XLA (jaxlib 0.10 under Shardy) prints a collective's groups as a mesh and the mesh axes that form
one group, e.g. ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``, with sub-axes ``a:(pre)size`` (the
factor of axis ``a`` of size ``size`` whose smaller factors multiply to ``pre``), and optionally
the mesh's device order, ``, device_ids=(0,2,1,3)`` or as an iota ``, device_ids=([2,2]T(1,0))``
(what GSPMD writes for a collective over the second axis of a 2x2 mesh inside a ``lax.scan``).
The meaning, as XLA's ``MeshAxesReplicaGroupList::flattened_replica_groups`` defines it and JAX
executes it (checked against JAX's own execution of the jitted programs by
tests/test_witness_vs_jax.py, and against XLA's CPU runtime by tests/test_jax_groups_and_rank.py):

- the device array is the mesh's device order (iota without ``device_ids``) viewed with the
  mesh's axis sizes;
- a mesh axis with sub-axes is split into factors ``[pre, size, rest]`` (several sub-axes of one
  axis: sorted by ``pre``, with padding factors between them);
- the array is transposed so the axes not in the group come first (in mesh order) and the
  group's axes last (in the order listed), flattened, and cut into groups of the product of the
  group axes' sizes. Each group lists its devices in that order (a device's index in its group).

An iota device order ``[d0,d1,...]T(perm)`` is iota over the product, viewed with ``[d0,d1,...]``,
transposed by ``perm`` and flattened (XLA's IotaTileAssignment; ``[dims]<=[reshape]T(perm)``
likewise over ``reshape``).

Beware: XLA's HLO -> StableHLO importer (the route the witness compiles by) drops ``device_ids``
and merges such a mesh with the plain mesh of the same axes, so the witness executes every
mesh list with a device order as the explicit groups this module computes (engine.witness.runtime).
"""

from __future__ import annotations

import re
from itertools import product

MAX_MESH_DEVICES = 1 << 16  # as for iota groups: far past any real mesh

_MESH = re.compile(
    r"mesh\[(?P<axes>[^\[\]]*)\]\s*(?:,\s*device_ids=\((?P<ids>.*)\))?\s*\{(?P<group>[^{}]*)\}\Z",
    re.S,
)
_AXIS = re.compile(r"\s*(?:'([^']*)'|\"([^\"]*)\"|([A-Za-z0-9_.\-]+))\s*=\s*(\d+)\s*\Z")
_REF = re.compile(r"\s*(?:'([^']*)'|\"([^\"]*)\"|([A-Za-z0-9_.\-]+))\s*(?::\s*\(\s*(\d+)\s*\)\s*(\d+))?\s*\Z")


class MeshGroupError(ValueError):
    pass


def _transpose(flat: list[int], dims: list[int], perm: list[int]) -> list[int]:
    """Row-major ``flat`` viewed with ``dims``, transposed by ``perm``, flattened again."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    tdims = [dims[p] for p in perm]
    tstrides = [strides[p] for p in perm]
    return [flat[sum(i * s for i, s in zip(idx, tstrides, strict=True))] for idx in product(*(range(d) for d in tdims))]


_IOTA_ORDER = re.compile(r"\s*\[([0-9,\s]+)\](?:\s*<=\s*\[([0-9,\s]+)\])?\s*(?:T\(([0-9,\s]*)\))?\s*\Z")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def device_order(ids: str, total: int, raw: str) -> list[int]:
    """The device ids of a mesh in array order: ``0,2,1,3`` as written, or an iota
    ``[2,2]T(1,0)`` / ``[4]<=[2,2]T(1,0)`` (see the module doc). Must be a permutation of
    0..total-1."""
    m = _IOTA_ORDER.match(ids)
    if m is not None:
        dims = _ints(m.group(2) if m.group(2) is not None else m.group(1))
        size = 1
        for d in dims:
            size *= d
        perm = _ints(m.group(3)) if m.group(3) is not None else list(range(len(dims)))
        if size != total or sorted(perm) != list(range(len(dims))):
            raise MeshGroupError(f"device_ids ({ids.strip()}) is not an order of the mesh's {total} devices in '{raw}'")
        order = _transpose(list(range(total)), dims, perm)
    else:
        try:
            order = [int(x) for x in ids.split(",")]
        except ValueError:
            raise MeshGroupError(f"expected device_ids like (0,2,1,3) or ([2,2]T(1,0)), got '({ids.strip()})' in '{raw}'") from None
    if sorted(order) != list(range(total)):
        raise MeshGroupError(f"device_ids ({ids.strip()}) is not a permutation of the mesh's {total} devices in '{raw}'")
    return order


def _name(m: re.Match[str]) -> str:
    return next(g for g in m.groups()[:3] if g is not None)


def mesh_groups(raw: str) -> list[list[int]]:
    """Explicit replica groups of a ``mesh[...] {...}`` replica-group list (see the module doc)."""
    m = _MESH.match(raw.strip())
    if m is None:
        raise MeshGroupError(f"expected mesh replica groups like mesh['x'=2,'y'=4] {{'y'}}, got '{raw}'")
    names: list[str] = []
    sizes: list[int] = []
    for part in m.group("axes").split(","):
        a = _AXIS.match(part)
        if a is None:
            raise MeshGroupError(f"expected a mesh axis like 'x'=4, got '{part.strip()}'")
        if _name(a) in names:
            raise MeshGroupError(f"mesh axis '{_name(a)}' appears twice")
        names.append(_name(a))
        sizes.append(int(a.group(4)))
    total = 1
    for s in sizes:
        if s < 1:
            raise MeshGroupError(f"mesh axis sizes must be >= 1, got {sizes}")
        total *= s
    if total > MAX_MESH_DEVICES:
        raise MeshGroupError(f"a mesh of {total} devices is beyond the {MAX_MESH_DEVICES} this tool expands")
    devices = list(range(total)) if m.group("ids") is None else device_order(m.group("ids"), total, raw)
    refs: list[tuple[int, int | None, int | None]] = []  # (axis, pre, size) in listed order
    for part in m.group("group").split(",") if m.group("group").strip() else []:
        r = _REF.match(part)
        if r is None or _name(r) not in names:
            raise MeshGroupError(f"expected a mesh axis of {names} (optionally 'x':(pre)size), got '{part.strip()}'")
        ax = names.index(_name(r))
        pre, size = (int(r.group(4)), int(r.group(5))) if r.group(4) is not None else (None, None)
        if pre is not None and size is not None and (pre < 1 or size < 2 or sizes[ax] % (pre * size)):
            raise MeshGroupError(f"sub-axis '{_name(r)}':({pre}){size} does not divide axis size {sizes[ax]}")
        refs.append((ax, pre, size))
    # Split each grouped axis into factors; remember which factor each listed ref aggregates.
    factors: dict[int, list[int]] = {}
    agg: dict[int, dict[int, int]] = {}  # axis -> ref position -> factor index within the axis
    for ax in sorted({a for a, _, _ in refs}):
        mine = [(k, pre, size) for k, (a, pre, size) in enumerate(refs) if a == ax]
        if len(mine) == 1 and mine[0][1] is None:
            factors[ax], agg[ax] = [sizes[ax]], {mine[0][0]: 0}
            continue
        if any(pre is None for _, pre, _ in mine):
            raise MeshGroupError(f"axis '{names[ax]}' is listed whole and as sub-axes")
        dims: list[int] = []
        where: dict[int, int] = {}
        prefix = 1
        for k, pre, size in sorted(mine, key=lambda t: t[1] or 0):
            assert pre is not None and size is not None
            if pre % prefix:
                raise MeshGroupError(f"sub-axes of '{names[ax]}' overlap")
            if pre != prefix:
                dims.append(pre // prefix)
                prefix = pre
            where[k] = len(dims)
            dims.append(size)
            prefix *= size
        if sizes[ax] % prefix:
            raise MeshGroupError(f"sub-axes of '{names[ax]}' do not divide its size {sizes[ax]}")
        if prefix != sizes[ax]:
            dims.append(sizes[ax] // prefix)
        factors[ax], agg[ax] = dims, where
    shape: list[int] = []
    offset: dict[int, int] = {}
    for ax, s in enumerate(sizes):
        offset[ax] = len(shape)
        shape.extend(factors.get(ax, [s]))
    grouped = [offset[a] + agg[a][k] for k, (a, _, _) in enumerate(refs)]
    if len(set(grouped)) != len(grouped):
        raise MeshGroupError("a mesh axis is listed twice in the group")
    perm = [d for d in range(len(shape)) if d not in grouped] + grouped
    flat = _transpose(devices, shape, perm)
    per = 1
    for d in grouped:
        per *= shape[d]
    if per < 2:
        raise MeshGroupError(f"a mesh replica-group list needs more than one device per group (as XLA's parser requires), got '{raw}'")
    return [flat[i : i + per] for i in range(0, len(flat), per)]
