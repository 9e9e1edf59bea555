"""Table of rules/onehot.egg: an overwriting scatter with distinct indices (a one-hot table)
whose rows are split over the ranks.

``ohshard(b, d, zb, zd, cb, cd, ub, ud, o, i, u)``: baseline scatter node b and distributed
scatter node d (node ids) both overwrite with provably distinct indices
(scatter.overwrite_indices_distinct), have identical dimension numbers, element types and
combiner, and indices that are ``concatenate(iota, C)`` (or ``(C, iota)``) along the index
vector dim with the iota at the same position, counting along indices dim i and addressing
operand dim o, where the operand's extent along o equals the indices' along i on each side;
the baseline's operand, indices and updates are c times the rank's along o, i and u (u: the
updates dim that i places) and equal elsewhere. zb/zd, cb/cd, ub/ud are the operand, the
other index piece and the updates of b and d. The rule relates d to b only when the three
pairs are proven row blocks (sharded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scatter import read_scatter

if TYPE_CHECKING:
    from ...ir import Instruction, Module
    from ..graph import Graphs

TABLES = ("ohshard",)

_DIMS = ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims", "index_vector_dim")


def _form(g: Graphs, gid: int) -> tuple[int, int, int, int, int, int] | None:
    """(o, i, u, pos, zero, other): the row dims, the iota's position in the concatenate and
    the node ids of the operand and the other index piece, for an overwriting one-hot scatter."""
    node = g.nodes[gid]
    ins: Instruction = node.ins
    module: Module = g.baseline if node.side == "baseline" else g.distributed
    if ins.opcode != "scatter" or len(node.operands) != 3:
        return None
    shapes = [g.nodes[o].ins.shape for o in node.operands]
    form = read_scatter(ins, shapes, module)
    if isinstance(form, str) or form.combiner != "overwrite":
        return None
    cat = g.nodes[node.operands[1]]
    ivd = form.index_vector_dim
    idims = tuple(shapes[1].dims)
    if cat.ins.opcode != "concatenate" or len(cat.operands) != 2 or list(cat.ins.parsed.get("dimensions", [])) != [ivd]:
        return None
    for pos, piece in enumerate(cat.operands):
        p = g.nodes[piece].ins
        if p.opcode != "iota" or tuple(p.shape.dims)[ivd] != 1:
            continue
        i = p.parsed.get("iota_dimension")
        if not isinstance(i, int) or i == ivd:
            continue
        o = form.scatter_dims_to_operand_dims[pos]
        if tuple(shapes[0].dims)[o] != idims[i]:
            continue
        # The updates' scatter dims are the indices' dims without the index vector dim, in order.
        scatter_dims = [x for x in range(len(idims)) if x != ivd]
        upd_scatter = [x for x in range(len(shapes[2].dims)) if x not in form.update_window_dims]
        u = upd_scatter[scatter_dims.index(i)]
        return o, i, u, pos, node.operands[0], cat.operands[1 - pos]
    return None


def _scaled(big: tuple[int, ...], small: tuple[int, ...], d: int, c: int) -> bool:
    return len(big) == len(small) and all(b == (s * c if x == d else s) for x, (b, s) in enumerate(zip(big, small, strict=True)))


def graph_rows(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    c = g.spec.c
    found: dict[str, list[tuple[int, tuple[int, int, int, int, int, int]]]] = {"baseline": [], "distributed": []}
    for n in g.nodes:
        if n.ins.opcode == "scatter":
            f = _form(g, n.gid)
            if f is not None:
                found[n.side].append((n.gid, f))
    for b, fb in found["baseline"]:
        bi = g.nodes[b].ins
        for d, fd in found["distributed"]:
            di = g.nodes[d].ins
            if fb[:4] != fd[:4] or bi.shape.dtype != di.shape.dtype or bi.parsed.get("reducer") != di.parsed.get("reducer"):
                continue
            if any(bi.parsed.get(k) != di.parsed.get(k) for k in _DIMS):
                continue
            o, i, u = fb[:3]
            bs = [g.nodes[x].ins.shape for x in g.nodes[b].operands]
            ds = [g.nodes[x].ins.shape for x in g.nodes[d].operands]
            if any(x.dtype != y.dtype for x, y in zip(bs, ds, strict=True)):
                continue
            if not (_scaled(tuple(bs[0].dims), tuple(ds[0].dims), o, c) and _scaled(tuple(bs[1].dims), tuple(ds[1].dims), i, c) and _scaled(tuple(bs[2].dims), tuple(ds[2].dims), u, c)):
                continue
            rows["ohshard"].append((b, d, fb[4], fd[4], fb[5], fd[5], g.nodes[b].operands[2], g.nodes[d].operands[2], o, i, u))
