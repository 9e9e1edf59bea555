"""Tables of rules/convmax.egg: a float convert moved through a reduce max/min.

``cvred(kc, kr, op, kc2, kr2, l2)``  kc a float->float convert (other float type) whose operand
        is a reduce kr with reducer op (max or min) of a tensor y of kc's source type; kc2 the
        convert of y to kc's type, kr2 the same reduce (dims, reducer) on kc2's result, l2 the
        literal key of a scalar of kc's type that is an identity of op (a constant of either
        program: literals are shared; none, no row). Rows for both programs; on the baseline
        the two new terms get their shape rows from core.Tables (as any baseline instruction).

``cvlay(kc, kl, kc2, kl2)``  kc such a convert whose operand is a reshape or transpose kl of
        such a reduce (JAX's keepdims max: reduce, reshape, then convert); kc2 the convert on
        the reduce's shape, kl2 the same layout op on kc's type.

Cost: one pass over the nodes looking for a convert of a reduce; a program without one (every
f32 model) writes nothing and gets no literal scan.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...ir import Shape
from ..signature import make_sig
from .core import Tables
from .values import finite_extremes, identity_of, scalar_of

if TYPE_CHECKING:
    from ..graph import Graphs

Rows = dict[str, list[tuple[object, ...]]]

TABLES: tuple[str, ...] = ("cvred", "cvlay")

FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
EXTREMES = frozenset({"max", "min"})
LAYOUT = frozenset({"reshape", "transpose"})


def _identity_literals(g: Graphs) -> dict[tuple[str, str], str]:
    """(dtype, op) -> the key of one scalar constant of that type that is an identity of op."""
    from ..graph import _literal_key  # graph imports this package: read it at call time

    out: dict[tuple[str, str], str] = {}
    for n in g.nodes:
        if n.ins.opcode != "constant" or n.ins.shape.dims != () or n.ins.shape.dtype not in FLOATS:
            continue
        for op in identity_of(n.ins, scalar_of(n.ins), finite_extremes(g)):
            if op in EXTREMES:
                out.setdefault((n.ins.shape.dtype, op), _literal_key(n.ins, n.gid))
    return out


def graph_rows(rows: Rows, g: Graphs) -> None:
    lits: dict[tuple[str, str], str] | None = None
    tables = Tables(g.spec.c, rows)
    for z in g.nodes:
        if z.ins.opcode != "convert" or z.sig is None or len(z.operands) != 1:
            continue
        w = g.nodes[z.operands[0]]
        lay = None
        if w.ins.opcode in LAYOUT and len(w.operands) == 1 and w.sig is not None:
            lay, w = w, g.nodes[w.operands[0]]
        if w.ins.opcode != "reduce" or w.sig is None or len(w.operands) != 2:
            continue
        op = w.ins.parsed.get("reducer")
        src, dst = w.ins.shape.dtype, z.ins.shape.dtype
        y = g.nodes[w.operands[0]]
        # Floats only, two types (an int convert may wrap); max/min only (a sum rounds per step).
        if op not in EXTREMES or src not in FLOATS or dst not in FLOATS or src == dst or y.ins.shape.dtype != src:
            continue
        # The law needs a non-empty set: over an empty dim the reduce is its init, and convert(i)
        # need not be i2 (-inf against f16's lowest; tests/soundness_regressions/convert_of_empty_max).
        if any(y.ins.shape.dims[int(x)] == 0 for x in w.ins.parsed.get("dimensions", [])):
            continue
        if lits is None:
            lits = _identity_literals(g)
        l2 = lits.get((dst, str(op)))
        if l2 is None:
            continue
        ydims = tuple(y.ins.shape.dims)
        conv = dataclasses.replace(z.ins, name="convmax", shape=Shape(dst, ydims), operands=["o0"])
        red = dataclasses.replace(w.ins, name="convmax", shape=Shape(dst, tuple(w.ins.shape.dims)), operands=["o0", "o1"])
        kc2 = make_sig(conv, [Shape(src, ydims)])
        kr2 = make_sig(red, [Shape(dst, ydims), Shape(dst, ())])
        base = z.side == "baseline"
        if base:
            tables.baseline(kc2, conv)
            tables.baseline(kr2, red, init_identities=(str(op),))
        kc = z.sig.key()
        if lay is not None:
            # convert(layout(w)) = layout(convert(w)): values only move, exact for every type.
            wdims = tuple(w.ins.shape.dims)
            conv_w = dataclasses.replace(z.ins, name="convmax", shape=Shape(dst, wdims), operands=["o0"])
            lay2 = dataclasses.replace(lay.ins, name="convmax", shape=Shape(dst, tuple(lay.ins.shape.dims)), operands=["o0"])
            kcw, kl2 = make_sig(conv_w, [Shape(src, wdims)]), make_sig(lay2, [Shape(dst, wdims)])
            if base:
                tables.baseline(kcw, conv_w)
                tables.baseline(kl2, lay2)
            rows["cvlay"].append((kc, lay.sig.key(), kcw.key(), kl2.key()))
            kc = kcw.key()
        rows["cvred"].append((kc, w.sig.key(), str(op), kc2.key(), kr2.key(), l2))
