"""Tables of rules/rankpos.egg: exact positions (iotas, arange literals) at rank offsets.

``iotaval(k, d, b, n, S)``  k counts b, b+1, ..., b+n-1 along d exactly (an iota or arange
                            literal whose values all fit its type), shape text S;
``perrank(S, d, Sp)``       shape S with dim d divided by c is Sp;
``numconv(k, lo, hi, S)``   an int->int (or int->float) convert exact within [lo, hi];
``unitmove(k, i, j, S)``    a reshape that only inserts/removes unit dims carries dim i to j;
``gatherrows(k, d, w, Si)`` distributed index_select of w rows along d (rows kept in place);
``intshl(k, lo, hi)``       int shift-left with its type's range;
``truelit(k)``, ``andop(k)``, ``andreduce(k)``, ``extop(k, op)``, ``fcmpop(k, dir)``,
``farith(k, op, 2^p)``, ``fnegop(k)``: op classes the position rules follow;
``reduceflip(k, d, op, kp, flip)``  baseline float max/min reduce along d, kp its negated twin;
``dusat(...)``              distributed dynamic-update-slice of 1/c along one dim at a start;
``maskforr(kbc, kr, kp)``   a per-index mask broadcast over gathered rows kept as a unit dim.

Side conditions (audit, issue 23): an iota counts 0..n-1 only while n-1 fits its type (a float's
up to 2^significand bits, an int's up to its largest value: s8[256] wraps); arange literals only
when printed in full and every element is in range; float arithmetic rows carry 2^p, the bound
within which integers stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...hlo.literals import int_range
from ...ir import Instruction, Shape
from ..signature import Sig
from .values import (
    FLOAT_PRECISION,
    INT_BITS,
    arange_start,
    int_bounds,
    iota_exact,
    scalar_of,
    shape_text,
)

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = (
    "iotaval", "perrank", "numconv", "unitmove", "gatherrows", "intshl", "truelit", "andop", "andreduce", "extop",
    "fcmpop", "farith", "fnegop", "reduceflip", "dusat", "maskforr",
)  # fmt: skip


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None]:
    c = g.spec.c

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None:
            _rpos_tables(rows, node.ins, key, [], c)
            return
        _rpos_tables(rows, node.ins, key, opnd, c, node.side, sig)
        if node.ins.opcode == "dynamic-update-slice" and node.side == "distributed" and len(node.operands) >= 3:
            _dusat(rows, node, opnd, g, c)

    return visit


def _dusat(rows: Rows, node: Node, opnd: list[Shape], g: Graphs, c: int) -> None:
    """The update covers whole extents but along one dim d, where it is 1/c of the operand's,
    at a start that may move; every other start literal 0."""
    src, upd = opnd[0].dims, opnd[1].dims
    idx = node.operands[2:]
    if len(src) == len(upd) == len(idx):
        moving = [i for i, o in enumerate(idx) if scalar_of(g.nodes[o].ins) != 0 or g.nodes[o].ins.opcode != "constant"]
        if len(moving) == 1:
            d = moving[0]
            if all(upd[i] == src[i] for i in range(len(src)) if i != d) and upd[d] * c == src[d]:
                rows["dusat"].append((node.gid, node.operands[0], node.operands[1], d, upd[d], idx[d]))


def _rpos_tables(rows: Rows, ins: Instruction, key: str, opnd: list[Shape], c: int, side: str = "", sig: Sig | None = None) -> None:
    """Tables for rules/rankpos.egg: iota-like literals, exact converts from ints, row gathers
    at rank positions, integer shift-lefts, range-decided predicates, float rank arithmetic,
    max/min identities and negated extremes."""
    op, out = ins.opcode, ins.shape
    if op == "negate" and out.dtype in FLOAT_PRECISION:
        rows["fnegop"].append((key,))
    if op == "reduce" and sig is not None and side == "baseline" and len(opnd) == 2 and out.dtype in FLOAT_PRECISION:
        dims = list(ins.parsed.get("dimensions", []))
        red = ins.parsed.get("reducer")
        if len(dims) == 1 and red in ("max", "min"):
            d = dims[0]
            n = opnd[0].dims[d]
            if n % c == 0 and n >= c:
                si = (*opnd[0].dims[:d], n // c, *opnd[0].dims[d + 1 :])
                flip = "min" if red == "max" else "max"
                rows["reduceflip"].append((key, d, red, sig.with_dims([si, opnd[1].dims], reducer=flip).key(), flip))
    here = shape_text(out.dtype, tuple(out.dims))

    def per_rank(d: int) -> str:
        n = out.dims[d]
        return shape_text(out.dtype, (*out.dims[:d], n // c, *out.dims[d + 1 :])) if n % c == 0 else "-"

    if op in ("iota", "constant", "convert", "reshape"):
        for d, n in enumerate(out.dims):
            if n % c == 0 and n > 0:
                rows["perrank"].append((here, d, per_rank(d)))

    if op == "iota" and (out.dtype in INT_BITS or out.dtype in FLOAT_PRECISION) and not out.is_tuple:
        d = ins.parsed.get("iota_dimension")
        # An iota counts 0 .. n-1 exactly only while every value is in its type: a float's up to
        # 2^(significand bits) (bf16: 256; past that, rounding repeats values), an int's up to the
        # type's largest value (s8[256] counts 0..127, -128..-1: it wraps). rules/rankpos.egg rpos.
        if isinstance(d, int) and 0 <= d < len(out.dims) and out.dims[d] > 0 and iota_exact(out.dtype, out.dims[d]):
            rows["iotaval"].append((key, d, 0, out.dims[d], here))
    elif op == "constant":
        if out.dtype == "pred" and out.dims == () and (ins.literal or "").strip() == "true":
            rows["truelit"].append((key,))
        b = arange_start(ins)
        lo, hi = int_range(out.dtype) if out.dtype in INT_BITS else (0, -1)
        if b is not None and lo <= b and b + out.dims[0] - 1 <= hi:  # literals are in range; checked anyway
            rows["iotaval"].append((key, 0, b, out.dims[0], here))
    elif op == "convert" and opnd and opnd[0].dtype in INT_BITS:
        if out.dtype in INT_BITS:
            rows["numconv"].append((key, *int_bounds(out.dtype), here))
        elif out.dtype in FLOAT_PRECISION:
            p = 1 << FLOAT_PRECISION[out.dtype]
            rows["numconv"].append((key, -p, p, here))
    elif op == "reshape" and opnd and not out.is_tuple:
        # A reshape that only inserts or removes size-1 dims carries each other dim to the
        # result in order (XLA:CPU's compiled text bitcasts iota[n, 1] to [n]): rules/rankpos.egg.
        src = opnd[0].dims
        si, so = [i for i, n in enumerate(src) if n != 1], [j for j, n in enumerate(out.dims) if n != 1]
        if [src[i] for i in si] == [out.dims[j] for j in so]:
            for i, j in zip(si, so, strict=True):
                rows["unitmove"].append((key, i, j, here))
    elif op == "and" and out.dtype == "pred":
        rows["andop"].append((key,))
    elif op == "reduce" and out.dtype == "pred" and ins.parsed.get("reducer") == "and":
        rows["andreduce"].append((key,))
    elif op in ("maximum", "minimum") and len(opnd) == 2 and opnd[0].dims == opnd[1].dims:
        rows["extop"].append((key, "max" if op == "maximum" else "min"))  # rules/algebra.egg
    elif op == "compare" and opnd and opnd[0].dtype in FLOAT_PRECISION and isinstance(ins.parsed.get("direction"), str):
        rows["fcmpop"].append((key, ins.parsed["direction"]))
    elif op in ("multiply", "add", "subtract") and out.dtype in FLOAT_PRECISION:
        rows["farith"].append((key, op, 1 << FLOAT_PRECISION[out.dtype]))
    elif op == "shift-left" and out.dtype in INT_BITS:
        rows["intshl"].append((key, *int_bounds(out.dtype)))
    elif op == "gather" and side == "distributed" and len(opnd) == 2:
        src, idx = opnd[0].dims, opnd[1].dims
        p = ins.parsed
        collapsed = list(p.get("collapsed_slice_dims", []))
        if len(idx) != 1 or p.get("index_vector_dim") != 1 or len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
            return
        d = collapsed[0]
        w = idx[0]
        if not 0 <= d < len(src) or src[d] != c * w or list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
            return
        # Rows kept in place: the gathered (batch) dim is output dim d, the others offset dims.
        if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or tuple(out.dims) != tuple(w if i == d else n for i, n in enumerate(src)):
            return
        if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
            return
        rows["gatherrows"].append((key, d, w, shape_text(opnd[1].dtype, tuple(idx))))


def graph_rows(rows: Rows, g: Graphs) -> None:
    """maskforr(kbc, kr, kp) (rules/rankpos.egg): gather kp keeps each row as a unit dim
    ([N, 1, h]); reshape kr drops that unit dim ([N, h], the same elements in the same order);
    broadcast kbc spreads a per-index mask ([N]) over those rows (dims={0})."""
    nodes = [n for n in g.nodes if n.side == "distributed" and n.sig is not None]
    gathers = {n.sig.key(): n for n in nodes if n.ins.opcode == "gather"}  # type: ignore[union-attr]
    for _, kp, _w in rows["gathershard"]:
        gather = gathers.get(str(kp))
        if gather is None or gather.ins.shape.rank != 3 or gather.ins.shape.dims[1] != 1 or list(gather.ins.parsed.get("collapsed_slice_dims", [])):
            continue
        n_ids, _, h = gather.ins.shape.dims
        for r in nodes:
            if r.ins.opcode == "reshape" and r.ins.shape.dims == (n_ids, h) and g.nodes[r.operands[0]].ins.shape.dims == (n_ids, 1, h):
                for b in nodes:
                    if (b.ins.opcode == "broadcast" and b.ins.shape.dims == (n_ids, h) and g.nodes[b.operands[0]].ins.shape.dims == (n_ids,)
                            and g.nodes[b.operands[0]].ins.shape.dtype == "pred" and list(b.ins.parsed.get("dimensions", [])) == [0]):
                        rows["maskforr"].append((b.sig.key(), r.sig.key(), kp))  # type: ignore[union-attr]

