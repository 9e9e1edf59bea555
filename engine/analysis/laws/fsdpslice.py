"""Table of rules/fsdpslice.egg: a layer's slice of an FSDP-cut stacked parameter, gathered whole
inside the loop (flax ``nn.scan`` over layers with FSDP: XLA's partitioner gathers
``dynamic-slice(param, layer)`` over the data axis, not the parameter itself).

``fsdpslice(b, ag, d, kind, ib, id)``: distributed node ``ag`` is an all-gather, over exactly the
binding's gathered groups, of ``dynamic-slice(p', ..., id, ...)`` moved only by ops that keep the
elements in row-major order and change unit dims only (reshape, copy, a broadcast adding no
elements); baseline node ``b`` is ``dynamic-slice(p, ..., ib, ...)`` moved likewise. ``p'`` is a
parameter bound ``gathered`` to baseline parameter ``p`` (relations: duplicate, or sharded along
a dim); both slices cut the same single dim ``l`` (neither the gathered dim nor the sharded
dim) to the same size and take every other dim whole; the all-gather's dim is the moved
position of the gathered dim; ``b``'s shape is ``ag``'s with the moved sharded dim ``d`` times c
(kind "s") or equal (kind "d"); the start ``id`` computes from literals only (never an input:
every device of a gathered group slices the same layer). The rule asks dup(ib, id) itself.

``fsdpds(x)``: distributed node ``x`` is such a layer slice of a gathered parameter, or one of its
moves: a piece of the weight its all-gather restores (related for localization only, so that a
wrong gather, not the slice, is where the rules stop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import InputError
from ..inputs import param

if TYPE_CHECKING:
    from ...ir import Instruction
    from ..graph import Graphs

TABLES = ("fsdpslice", "fsdpds")
MOVES = frozenset({"reshape", "copy", "broadcast"})

Rows = dict[str, list[tuple[object, ...]]]


def _nonunit(dims: tuple[int, ...] | list[int]) -> list[int]:
    return [i for i, n in enumerate(dims) if n != 1]


def _keeps_order(ins: Instruction, src: Instruction) -> bool:
    """``ins`` holds ``src``'s elements in row-major order with only unit dims changed."""
    a, b = tuple(src.shape.dims), tuple(ins.shape.dims)
    if ins.opcode == "broadcast":
        dims = [int(x) for x in ins.parsed.get("dimensions", [])]
        if dims != sorted(dims) or ins.shape.numel != src.shape.numel:
            return False
    return ins.shape.numel == src.shape.numel and [n for n in a if n != 1] == [n for n in b if n != 1]


def _cut(ds: Instruction, src: Instruction) -> tuple[int, int] | None:
    """(dim, size) of the one dim ``ds`` cuts (every other dim whole), or None."""
    sizes = [int(x) for x in ds.parsed.get("dynamic_slice_sizes", [])]
    dims = list(src.shape.dims)
    if len(sizes) != len(dims):
        return None
    cut = [i for i, (s, n) in enumerate(zip(sizes, dims, strict=True)) if s != n]
    return (cut[0], sizes[cut[0]]) if len(cut) == 1 else None


def graph_rows(rows: Rows, g: Graphs) -> None:
    bindings = [b for b in g.spec.inputs if b.gathered is not None and b.baseline is not None and b.distributed is not None]
    if not bindings:
        return
    users: dict[int, list[int]] = {}
    for n in g.nodes:
        for o in n.operands:
            users.setdefault(o, []).append(n.gid)
    c = g.spec.c
    for b in bindings:
        assert b.gathered is not None and b.baseline is not None and b.distributed is not None
        rel = b.relation
        if rel.kind == "sharded" and not rel.blocks:
            kind, sd = "s", rel.dim or 0
        elif rel.kind == "duplicate":
            kind, sd = "d", -1
        else:
            continue
        try:
            bp = param(g.baseline, b.baseline, b.key, "baseline", g.spec.path)
            dp = param(g.distributed, b.distributed, b.key, "distributed", g.spec.path)
        except InputError:  # a binding check_inputs reports itself
            continue
        bgid, dgid = g.by_name.get(("baseline", bp.name)), g.by_name.get(("distributed", dp.name))
        if bgid is None or dgid is None:
            continue
        gdim = b.gathered.dim
        want_groups = sorted(tuple(x) for x in b.gathered.groups)
        base_slices = [(u, _cut(g.nodes[u].ins, bp)) for u in users.get(bgid, []) if g.nodes[u].ins.opcode == "dynamic-slice" and g.nodes[u].operands[0] == bgid]
        for ds in users.get(dgid, []):
            dn = g.nodes[ds]
            if dn.ins.opcode != "dynamic-slice" or dn.operands[0] != dgid:
                continue
            cut = _cut(dn.ins, dp)
            if cut is None or cut[0] in (gdim, sd) or dn.ins.shape.dims[gdim] <= 1 or (sd >= 0 and dn.ins.shape.dims[sd] <= 1):
                continue
            start = dn.operands[1 + cut[0]]
            if not _literal_only(g, start):
                continue
            # The layer's slice and its moves: pieces of the restored weight (localization).
            rows["fsdpds"].extend((x,) for x in [ds, *_moved(g, users, ds)])
            nu = _nonunit(dn.ins.shape.dims)
            gpos, spos = nu.index(gdim), (nu.index(sd) if sd >= 0 else -1)
            for ag in _gathers(g, users, ds):
                agi = g.nodes[ag].ins
                src = g.nodes[g.nodes[ag].operands[0]].ins
                adims = [int(x) for x in agi.parsed.get("dimensions", [])]
                groups = agi.parsed.get("replica_groups")
                if len(adims) != 1 or not groups or sorted(tuple(x) for x in groups) != want_groups:
                    continue
                snu = _nonunit(src.shape.dims)
                if len(snu) != len(nu) or snu[gpos] != adims[0]:
                    continue
                out = list(agi.shape.dims)
                want = list(out)
                if kind == "s":
                    want[_nonunit(out)[spos]] *= c
                for bds, bcut in base_slices:
                    if bcut != cut:
                        continue
                    bstart = g.nodes[bds].operands[1 + cut[0]]
                    for bz in [bds, *_moved(g, users, bds)]:
                        if list(g.nodes[bz].ins.shape.dims) == want and g.nodes[bz].ins.shape.dtype == agi.shape.dtype:
                            d = _nonunit(out)[spos] if kind == "s" else -1
                            rows["fsdpslice"].append((bz, ag, d, kind, bstart, start))


def _moved(g: Graphs, users: dict[int, list[int]], gid: int) -> list[int]:
    """Nodes reached from ``gid`` through element-order-keeping moves only."""
    out, todo = [], [gid]
    while todo:
        x = todo.pop()
        for u in users.get(x, []):
            n = g.nodes[u]
            if n.ins.opcode in MOVES and len(n.operands) == 1 and _keeps_order(n.ins, g.nodes[x].ins) and u not in out:
                out.append(u)
                todo.append(u)
    return out


def _gathers(g: Graphs, users: dict[int, list[int]], ds: int) -> list[int]:
    """The all-gathers of ``ds`` or of its element-order-keeping moves."""
    return [u for x in [ds, *_moved(g, users, ds)] for u in users.get(x, []) if g.nodes[u].ins.opcode == "all-gather" and len(g.nodes[u].operands) == 1]


def _literal_only(g: Graphs, gid: int) -> bool:
    """``gid`` computes from literals only (no parameter of the program, no device id)."""
    seen, todo = set(), [gid]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        n = g.nodes[x]
        if n.ins.opcode in ("parameter", "partition-id", "replica-id", "rng", "rng-bit-generator", "custom-call", "infeed", "recv"):
            return False
        todo.extend(n.operands)
    return len(seen) < 10_000
