"""Shape rows of the head-group relation ``kvg x x' d w z K o`` (rules/kvgroups.egg): dim d is K
groups, q = c/K ranks per group; o = 1 each group padded at its tail and split over its ranks,
o = 0 each rank holding its group's whole block (KV heads replicated to the degree, as
neuronx-distributed-inference's GQA.REPLICATE_TO_TP_DEGREE lays them out).

Where a rank's positions along d sit inside its group is the same for every op that acts on each
index of d alone, so the rows are rules/padded.egg's pad rows (laws/padded.PadTables) with K
inserted after the width: ``km1 km2 km2l km2r km3 kbn kdb kdc ksum kcat`` read as ``pm1 ...
pcat`` do. Two differences, both about K: an extent is only a (n, w) pair of K groups when K
divides n; and a reshape splitting d into (n/T, T, ...) keeps the layout only when T divides the
group's extent G = n/K as well as w (each group splits alike; the padding of a group stays at
its tail). Merges and whole-dim reshapes keep it for any K.

The family applies only to pairs whose relations file has a ``grouped`` input or a ``padded``
one with ``head_groups`` (``walk`` returns None otherwise: no rows, its rules are not loaded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir import Module, Shape
from ...relations import RelationSpec
from ..signature import Dims, Sig
from .core import reduce_init_identities
from .padded import PadTables

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("km1", "km2", "km2l", "km2r", "km3", "kbn", "kdb", "kdc", "ksum", "kcat", "krt")
_RENAME = {"pm1": "km1", "pm2": "km2", "pm2l": "km2l", "pm2r": "km2r", "pm3": "km3", "pbn": "kbn", "pdb": "kdb", "pdc": "kdc", "psum": "ksum", "pcat": "kcat"}
_TWO_DIMS = ("pdb", "pdc")  # rows (k, dl, dr, w, ...): the width is the fourth field


def grouped_inputs(spec: RelationSpec, baseline: Module) -> dict[int, set[tuple[int, int]]]:
    """K -> the (n, w) pairs of the inputs held in K head groups (baseline extent, rank width)."""
    params = {p.parameter_number: p for p in baseline.entry.parameters} | {p.name: p for p in baseline.entry.parameters}
    out: dict[int, set[tuple[int, int]]] = {}
    for b in spec.inputs:
        r = b.relation
        if b.baseline is None or r.head_groups < 2 or r.kind not in ("grouped", "padded"):
            continue
        p = params.get(b.baseline if isinstance(b.baseline, int) else b.baseline.lstrip("%"))
        if p is None or r.dim is None or r.dim >= len(p.shape.dims):
            continue
        n = p.shape.dims[r.dim]
        out.setdefault(r.head_groups, set()).add((n, n // r.head_groups if r.kind == "grouped" else r.width or 0))
    return out


class GroupTables(PadTables):
    """PadTables for K head groups: rows renamed to the km tables, K after the width."""

    def __init__(self, c: int, rows: Rows, pairs: set[tuple[int, int]], k: int) -> None:
        self.k = k
        super().__init__(c, rows, pairs)

    def add(self, table: str, *row: object) -> None:
        at = 4 if table in _TWO_DIMS else 3
        self.rows[_RENAME[table]].append((*row[:at], self.k, *row[at:]))

    def note(self, n: int, w: int) -> None:
        # K groups of G = n/K, the q = c/K ranks of a group covering it: q·w >= G.
        if n % self.k == 0:
            super().note(n, w)

    def _splits(self, n: int, t: int) -> bool:
        # A split of d into (n/T, T, ...) only where T divides the group's extent n/K too
        # (every group splits alike, its tail stays its tail).
        return (n // self.k) % t == 0


def _set(dims: Dims, d: int, v: int) -> Dims:
    return (*dims[:d], v, *dims[d + 1 :])


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None] | None:
    """None (nothing to write: the rules are not loaded) without inputs in head groups."""
    found = grouped_inputs(g.spec, g.baseline)
    if not found:
        return None
    c = g.spec.c
    tables = [GroupTables(c, rows, pairs, k) for k, pairs in sorted(found.items()) if c % k == 0]

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None or node.side != "baseline":
            return
        init = reduce_init_identities(g, node)
        for t in tables:
            t.baseline(sig, node.ins, bool(init) and node.ins.parsed.get("reducer") in init)
        if node.ins.opcode == "transpose":
            row = _transposed_repeat(g, node, sig)
            if row is not None:
                rows["krt"].append(row)

    return visit


def _transposed_repeat(g: Graphs, t2: Node, sig2: Sig) -> tuple[object, ...] | None:
    """krt(kt1, kt2, d0, d1, d2, kp): baseline t2 = transpose_P2(repeat_interleave(t1, R, d1)),
    t1 = transpose_P1(x) carrying x's dim d0 to d1, t2 carrying d1 to d2. With one query head
    per rank the rank's repeat is no op and its two transposes are one, transpose_P(x') with
    P[i] = P1[P2[i]] on x' (x's shape with extent 1 at d0): kp is that transpose's signature."""
    merge = g.nodes[t2.operands[0]]
    if merge.ins.opcode != "reshape" or not merge.operands:
        return None
    bc = g.nodes[merge.operands[0]]
    if bc.ins.opcode != "broadcast" or not bc.operands:
        return None
    t1 = g.nodes[bc.operands[0]]
    if t1.ins.opcode != "transpose" or t1.sig is None or not t1.operands:
        return None
    src, rep, out = tuple(t1.ins.shape.dims), tuple(bc.ins.shape.dims), tuple(merge.ins.shape.dims)
    dims = list(bc.ins.parsed.get("dimensions", []))
    found = [d for d in range(len(src)) if dims == [*range(d + 1), *range(d + 2, len(src) + 1)] and out == (*src[:d], src[d] * rep[d + 1], *src[d + 1 :])]
    if len(found) != 1:
        return None
    d1 = found[0]
    p1, p2 = list(t1.ins.parsed.get("dimensions", [])), list(t2.ins.parsed.get("dimensions", []))
    x_dims = tuple(g.nodes[t1.operands[0]].ins.shape.dims)
    if sorted(p1) != list(range(len(x_dims))) or sorted(p2) != list(range(len(x_dims))):
        return None
    d0, d2 = p1[d1], p2.index(d1)
    perm = [p1[p2[i]] for i in range(len(x_dims))]
    xp = _set(x_dims, d0, 1)
    kp = sig2.with_dims([xp], tuple(xp[i] for i in perm), dimensions=perm).key()
    return (t1.sig.key(), sig2.key(), d0, d1, d2, kp)
