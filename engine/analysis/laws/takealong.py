"""Tables of rules/takealong.egg: ``take_along_axis`` picks of any rank, and integer clips.

``tabg(k, d, n)``     gather k is jnp's ``take_along_axis`` along dim d of an operand of any rank
                      R >= 2 with extent n there: every other operand dim is a batching dim
                      paired with the index dim at the same position, start_index_map {d},
                      collapsed {d}, slice sizes all 1, no offset dims; the indices have the
                      result's shape plus a trailing index vector dim of extent 1 (or the
                      result's shape, index_vector_dim = R); the result has the operand's shape
                      with dim d of extent 1. Element p of the result (flat, row-major) is
                      operand[p with dim d replaced by index[p]] (XLA clamps the index into
                      [0, n - 1]): the result and the indices share their flat order.
``clipnode(z, x, lo, hi)``  node z is ``min(max(x, lo), hi)`` (either nesting or operand order,
                      or ``clamp(lo, x, hi)``) on an integer type, lo and hi literal fills (a
                      scalar constant or a broadcast of one) with lo <= hi: jnp.clip's lowering.
``flatsame(k)``       k is a reshape, or a broadcast that adds no element (dims in order, same
                      element count): element p of the result is element p of the operand.

Side conditions (the audit): shape rows are dtype-free facts; clipnode is written for integer
types only (no NaN, no -0.0, and the literals compared exactly in the type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .values import INT_BITS, scalar_of

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..graph import Graphs, Node
    from ..signature import Sig

TABLES = ("tabg", "clipnode", "flatsame")
OPCODES = frozenset({"gather", "reshape", "broadcast"})

Rows = dict[str, list[tuple[object, ...]]]


def _tabg(ins: Instruction, opnd: list[Shape]) -> tuple[int, int] | None:
    """(d, n) when the gather is a take_along_axis pick along d (extent n), else None."""
    if len(opnd) != 2:
        return None
    src, idx, out = tuple(opnd[0].dims), tuple(opnd[1].dims), tuple(ins.shape.dims)
    p = ins.parsed
    r = len(src)
    smap = list(p.get("start_index_map", []))
    if r < 2 or len(smap) != 1 or len(out) != r:
        return None
    d = int(smap[0])
    others = [i for i in range(r) if i != d]
    ivd = p.get("index_vector_dim")
    if not ((idx == (*out, 1) and ivd == r) or (idx == out and ivd == r)):
        return None
    if (list(p.get("collapsed_slice_dims", [])) != [d] or list(p.get("offset_dims", [])) != []
            or list(p.get("slice_sizes", [])) != [1] * r
            or list(p.get("operand_batching_dims", [])) != others or list(p.get("start_indices_batching_dims", [])) != others):
        return None
    if out != tuple(1 if i == d else src[i] for i in range(r)):
        return None
    return d, src[d]


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    key = sig.key()
    if ins.shape.is_tuple:
        return
    if ins.opcode == "gather":
        got = _tabg(ins, opnd)
        if got is not None:
            rows["tabg"].append((key, *got))
    elif ins.opcode == "reshape" and len(opnd) == 1:
        rows["flatsame"].append((key,))
    elif ins.opcode == "broadcast" and len(opnd) == 1 and opnd[0].numel == ins.shape.numel:
        dims = [int(x) for x in ins.parsed.get("dimensions", [])]
        if dims == sorted(dims) and len(set(dims)) == len(dims):
            rows["flatsame"].append((key,))


def _fill(g: Graphs, gid: int) -> int | None:
    """The int value every element of node gid holds when it is a literal fill (a scalar
    constant or a broadcast of one), else None."""
    ins = g.nodes[gid].ins
    if ins.opcode == "broadcast" and len(g.nodes[gid].operands) == 1:
        ins = g.nodes[g.nodes[gid].operands[0]].ins
        if ins.shape.dims != ():
            return None
    v = scalar_of(ins)
    return v if isinstance(v, int) else None


def _bounded(g: Graphs, n: Node, op: str) -> tuple[int, int] | None:
    """(operand, literal) when n is ``op`` of one literal fill and another node, else None."""
    if n.ins.opcode != op or len(n.operands) != 2:
        return None
    a, b = n.operands
    for lit, other in ((a, b), (b, a)):
        v = _fill(g, lit)
        if v is not None and _fill(g, other) is None:
            return other, v
    return None


def graph_rows(rows: Rows, g: Graphs) -> None:
    for n in g.nodes:
        dt = n.ins.shape.dtype
        if n.ins.shape.is_tuple or dt not in INT_BITS:
            continue
        if n.ins.opcode == "clamp" and len(n.operands) == 3:
            lo, x, hi = n.operands
            vlo, vhi = _fill(g, lo), _fill(g, hi)
            if vlo is not None and vhi is not None and vlo <= vhi and all(g.nodes[o].ins.shape.dtype == dt for o in n.operands):
                rows["clipnode"].append((n.gid, x, vlo, vhi))
            continue
        for outer, inner in (("minimum", "maximum"), ("maximum", "minimum")):
            top = _bounded(g, n, outer)
            if top is None:
                continue
            mid = g.nodes[top[0]]
            low = _bounded(g, mid, inner)
            if low is None or mid.ins.shape.dtype != dt:
                continue
            # min(max(x, lo), hi) or max(min(x, hi), lo): equal for lo <= hi
            vlo, vhi = (low[1], top[1]) if outer == "minimum" else (top[1], low[1])
            if vlo <= vhi:
                rows["clipnode"].append((n.gid, low[0], vlo, vhi))
