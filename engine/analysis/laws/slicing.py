"""Tables of rules/slicing.egg: rank arithmetic, index ranges, vocab-parallel gathers, repeats.

``intop(k, op, lo, hi)``  int add/subtract/multiply/remainder with the result type's exact range
                          [lo, hi] (every rule using it checks no value wraps);
``intdiv(k, top)``, ``intconv(k, top)``: int divide, int->int convert, with the type's top value;
``intwiden(k)``           an int convert keeping every value; ``boolconv(k)``: pred<->int;
``itof(k, 2^p)``, ``ftoi(k, top)``: int->float (exact up to 2^p), float->int conversions;
``fdivop(k)``, ``floorop(k)``: float divide, floor; ``onelem(k)``: one element to one element;
``cmpop(k, dir)``         int compare; ``orop(k)``; ``selectop(k)``;
``gathershard(k, kp, w)`` baseline row gather of a table split in blocks of w rows (kp per rank);
``gatherpick(k, d, n)``   distributed index_select of one index along d (extent n);
``dsliceat(...)``         distributed dynamic-slice taking 1/c along one dim at a moving start;
``keepsvals(k)``          reshape/transpose/broadcast/copy/slice (moves values, changes none);
``scalarbcast(k)``        broadcast of a scalar;
``repeatbc(k, d, R, N)``  broadcast inserting dim R right after d (repeat_interleave);
``mergenext(k, d)``       reshape merging dims d and d + 1;
``maskfor(kbc, kp)``      broadcast kbc spreads a per-index mask over the rows gather kp makes.

Side conditions (audit, issue 23): integer rows carry their type's exact range, so rules check
no value wraps (narrow and unsigned types included); converts carry values only when they keep
every value or the rule checks the range; float->int converts only within range (graph's
supported check refuses the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir import Instruction, Shape
from ..signature import Sig
from .values import (
    FLOAT_PRECISION,
    INT_BITS,
    index_select_dim,
    int_bounds,
    int_top,
    scalar_of,
    widens,
)

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = (
    "intop", "intdiv", "fdivop", "floorop", "onelem", "itof", "ftoi", "intwiden", "intconv", "boolconv", "cmpop", "orop",
    "selectop", "gathershard", "gatherpick", "dsliceat", "keepsvals", "scalarbcast", "repeatbc", "mergenext", "maskfor",
)  # fmt: skip


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None]:
    c = g.spec.c

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is not None:
            _class_rows(rows, key, node.ins, opnd)
            _rank_tables(rows, node.side, node, sig, opnd, g, c)

    return visit


def _class_rows(rows: Rows, key: str, ins: Instruction, opnd: list[Shape]) -> None:
    op = ins.opcode
    if op in ("reshape", "transpose", "broadcast", "copy", "slice"):
        rows["keepsvals"].append((key,))
    if op == "broadcast" and opnd[0].dims == ():
        rows["scalarbcast"].append((key,))
    if op == "broadcast" and opnd:
        rows["repeatbc"].extend(_repeat_broadcast(key, ins, opnd[0].dims))
    if op == "reshape" and opnd:
        src, out = opnd[0].dims, ins.shape.dims
        for d in range(len(src) - 1):
            if out == (*src[:d], src[d] * src[d + 1], *src[d + 2 :]):
                rows["mergenext"].append((key, d))


def _repeat_broadcast(key: str, ins: Instruction, src: tuple[int, ...]) -> list[tuple[object, ...]]:
    """repeatbc rows (key, d, R, N): the broadcast keeps every operand dim in place except that
    it inserts a new dim of extent R right after d (repeat_interleave's first step); N = the
    extent of d and the new dim merged."""
    dims = list(ins.parsed.get("dimensions", []))
    out = ins.shape.dims
    rows: list[tuple[object, ...]] = []
    if len(out) != len(src) + 1:
        return rows
    for d in range(len(src)):
        if dims == [*range(d + 1), *range(d + 2, len(src) + 1)] and out == (*src[: d + 1], out[d + 1], *src[d + 1 :]):
            rows.append((key, d, out[d + 1], src[d] * out[d + 1]))
    return rows


def _rank_tables(rows: Rows, side: str, node: Node, sig: Sig, opnd: list[Shape], g: Graphs, c: int) -> None:
    """Tables for the rank-arithmetic and vocab-parallel rules of rules/slicing.egg."""
    ins = node.ins
    key = sig.key()
    op = ins.opcode
    out_t = ins.shape.dtype
    if op in ("add", "subtract", "multiply", "remainder") and out_t in INT_BITS:
        rows["intop"].append((key, op, *int_bounds(out_t)))
    elif op == "divide" and out_t in INT_BITS:
        rows["intdiv"].append((key, int_top(out_t)))
    elif op == "divide" and out_t in FLOAT_PRECISION:
        rows["fdivop"].append((key,))
    elif op == "floor" and out_t in FLOAT_PRECISION:
        rows["floorop"].append((key,))
    elif op in ("reshape", "broadcast", "copy") and opnd and opnd[0].numel == 1 and ins.shape.numel == 1:
        rows["onelem"].append((key,))
    elif op == "convert" and opnd:
        a = opnd[0].dtype
        if a in INT_BITS and out_t in FLOAT_PRECISION:
            rows["itof"].append((key, 1 << FLOAT_PRECISION[out_t]))
        if a in FLOAT_PRECISION and out_t in INT_BITS:
            rows["ftoi"].append((key, int_top(out_t)))
        if widens(a, out_t):
            rows["intwiden"].append((key,))
        if a in INT_BITS and out_t in INT_BITS:
            bits = INT_BITS[out_t] - (1 if out_t[0] == "s" else 0)
            rows["intconv"].append((key, (1 << min(bits, 62)) - 1))
        if (a == "pred" and out_t in INT_BITS) or (a in INT_BITS and out_t == "pred"):
            rows["boolconv"].append((key,))
    elif op == "compare" and opnd and opnd[0].dtype in INT_BITS:
        d = ins.parsed.get("direction")
        if isinstance(d, str):
            rows["cmpop"].append((key, d))
    elif op == "or" and out_t in ("pred", *INT_BITS):
        rows["orop"].append((key,))
    elif op == "select":
        rows["selectop"].append((key,))
    elif op == "gather" and side == "baseline" and len(opnd) == 2:
        src = opnd[0].dims
        p = ins.parsed
        sizes = list(p.get("slice_sizes", []))
        collapsed = list(p.get("collapsed_slice_dims", []))
        nb = ins.shape.rank - len(src)
        if ((collapsed == [0]
             # or the row kept as a unit dim, the offset dims trailing (XLA's compiled gathers)
             or (collapsed == [] and list(p.get("offset_dims", [])) == list(range(nb, nb + len(src)))))
                and list(p.get("start_index_map", [])) == [0]
                and src and src[0] % c == 0 and sizes == [1, *src[1:]]
                and (p.get("index_vector_dim") == len(opnd[1].dims)
                     # or an explicit index vector of one element (JAX: ids reshaped to [n, 1])
                     or (opnd[1].dims and opnd[1].dims[-1] == 1 and p.get("index_vector_dim") == len(opnd[1].dims) - 1))):
            w = src[0] // c
            kp = sig.with_dims([(w, *src[1:]), opnd[1].dims]).key()
            rows["gathershard"].append((key, kp, w))
    elif op == "gather" and side == "distributed" and len(opnd) == 2:
        d = index_select_dim(ins, opnd[0].dims, opnd[1].dims)
        if d is not None:
            rows["gatherpick"].append((key, d, opnd[0].dims[d]))
    elif op == "dynamic-slice" and side == "distributed" and len(node.operands) >= 2:
        src = opnd[0].dims
        sizes = list(ins.parsed.get("dynamic_slice_sizes", []))
        idx = node.operands[1:]
        if len(sizes) == len(src) == len(idx):
            moving = [i for i, o in enumerate(idx) if scalar_of(g.nodes[o].ins) != 0 or g.nodes[o].ins.opcode != "constant"]
            if len(moving) == 1:
                d = moving[0]
                if all(sizes[i] == src[i] for i in range(len(src)) if i != d) and sizes[d] * c == src[d]:
                    rows["dsliceat"].append((node.gid, node.operands[0], d, sizes[d], idx[d]))



def graph_rows(rows: Rows, g: Graphs) -> None:
    """maskfor(kbc, kp): broadcast kbc spreads a per-index mask over the rows gather kp makes."""
    dist_gathers = {n.sig.key(): n for n in g.nodes if n.side == "distributed" and n.sig is not None and n.ins.opcode == "gather"}
    bcasts = [n for n in g.nodes if n.side == "distributed" and n.sig is not None and n.ins.opcode == "broadcast" and g.nodes[n.operands[0]].ins.shape.dtype == "pred"]
    for _, kp, _w in rows["gathershard"]:
        gather = dist_gathers.get(str(kp))
        if gather is None:
            continue
        offset = list(gather.ins.parsed.get("offset_dims", []))
        batch = [d for d in range(gather.ins.shape.rank) if d not in offset]
        for n in bcasts:
            if n.ins.shape.dims == gather.ins.shape.dims and list(n.ins.parsed.get("dimensions", [])) == batch:
                rows["maskfor"].append((n.sig.key(), kp))  # type: ignore[union-attr]

