"""Tables of rules/algebra.egg: what a literal's value is, op classes, layout round trips.

``identlit(l, op)``   literal l is an identity of reducer op, compared exactly (values.identity_of;
                      read by rules/partition.egg too);
``zerolit(l)``, ``onelit(l)``, ``falselit(l)``: literal l is exactly 0, 1, false;
``litint(l, v)``      int literal l is v (within egglog's i64; rules/slicing.egg arithmetic);
``litfint(l, v)``     float literal l is the integer v, exactly (|v| <= 2^significand bits);
``litrecip(l, n)``    float literal l is exactly 1/n, n a power of two (rules/rankalgebra.egg);
``fillop(k)``         k fills with one value: broadcast of a scalar, reshape, convert, copy;
``mulop(k)``, ``addop(k)``: k is a multiply, an add; ``prednefalse(k)``: k is pred != (x != false
                      is x);
``reshapeback(k1, k2)``, ``transposeback(k1, k2)``: reshape (transpose) k2 undoes k1;
``unitbcast(kr, kb)`` distributed reshape kr only inserts unit dims: it is broadcast kb.

Side conditions: literal values are read exactly in their type (hlo.literals); an elided literal
(``{...}``) has no value; a reciprocal counts only when it is exact (fl(1/3) is not 1/3); a
u64 beyond i64 stays an opaque literal.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...hlo.literals import INT_BITS, is_int_value
from ...ir import Instruction, Shape
from ..signature import Sig
from .values import FLOAT_PRECISION, I64_MAX, I64_MIN, finite_extremes, identity_of, scalar_of

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]

TABLES = ("identlit", "zerolit", "onelit", "falselit", "litint", "litfint", "litrecip", "fillop", "mulop", "addop", "prednefalse", "reshapeback", "transposeback", "unitbcast")


def walk(rows: Rows, g: Graphs) -> object:
    finite = finite_extremes(g)  # is the lowest finite float an identity of max in this pair?

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None:
            literal_rows(rows, key, node.ins, finite)
        else:
            _class_rows(rows, key, node.side, sig, node.ins, opnd)

    return visit


def literal_rows(rows: Rows, lkey: str, ins: Instruction, finite: tuple[bool, bool] = (False, False)) -> None:
    """What constant ``ins`` (literal term ``lkey``) is an identity, zero, one, false or
    integer for."""
    value = scalar_of(ins)
    for op in identity_of(ins, value, finite):
        rows["identlit"].append((lkey, op))
    if ins.shape.dims == () and (ins.literal or "").strip() == "false":
        rows["falselit"].append((lkey,))
    if value is not None:
        if value == 0:
            rows["zerolit"].append((lkey,))
        if value == 1:
            rows["onelit"].append((lkey,))
        # egglog's int column is i64: a u64 beyond it stays an opaque literal (no rule
        # computes with it; it is still the same value on every rank).
        if ins.shape.dtype in INT_BITS and is_int_value(value) and I64_MIN <= value <= I64_MAX:
            rows["litint"].append((lkey, value))
        p = FLOAT_PRECISION.get(ins.shape.dtype)
        if p is not None and math.isfinite(value) and abs(value) <= 2.0**p and value == int(value):
            rows["litfint"].append((lkey, int(value)))
        if p is not None and 0 < value < 1 and math.isfinite(value):
            # 1/n exactly (n a power of two, so the literal is exact): x * (1/n) is x / n
            # (rules/rankalgebra.egg). A rounded reciprocal such as fl(1/3) is not 1/3.
            m, e = math.frexp(value)
            if m == 0.5 and -e + 1 <= 62:
                rows["litrecip"].append((lkey, 1 << (1 - e)))


def _class_rows(rows: Rows, key: str, side: str, sig: Sig, ins: Instruction, opnd: list[Shape]) -> None:
    op = ins.opcode
    if op in ("broadcast", "reshape", "convert", "copy") and (op != "broadcast" or opnd[0].dims == ()):
        rows["fillop"].append((key,))
    if op == "multiply":
        rows["mulop"].append((key,))
    if op == "add":
        rows["addop"].append((key,))
    if op == "compare" and ins.parsed.get("direction") == "NE" and opnd[0].dtype == "pred":
        rows["prednefalse"].append((key,))
    if side == "distributed" and op == "reshape":
        bkey = _unit_reshape_broadcast(sig)
        if bkey is not None:
            rows["unitbcast"].append((key, bkey))


def _unit_reshape_broadcast(sig: Sig) -> str | None:
    """The key of the broadcast equal to reshape ``sig`` when the reshape only inserts unit
    dims: the operand's dims keep their order, matched to the first result dim of their extent
    after the previous one with only unit dims skipped."""
    (dtype, src), (_, out) = sig.ins[0], sig.out
    if len(out) <= len(src):
        return None
    dims: list[int] = []
    j = 0
    for n in src:
        while j < len(out) and out[j] != n:
            if out[j] != 1:
                return None
            j += 1
        if j == len(out):
            return None
        dims.append(j)
        j += 1
    if any(out[x] != 1 for x in range(j, len(out))):
        return None
    return Sig("broadcast", (("dimensions", "[" + ",".join(map(str, dims)) + "]"),), ((dtype, src),), sig.out).key()


def graph_rows(rows: Rows, g: Graphs) -> None:
    """Pairs of reshape (transpose) signatures where the second undoes the first."""
    reshapes: dict[tuple[str, tuple[int, ...], tuple[int, ...]], set[str]] = {}
    transposes: dict[tuple[str, tuple[int, ...], tuple[int, ...]], set[str]] = {}
    for n in g.nodes:
        if n.sig is None or n.ins.opcode not in ("reshape", "transpose"):
            continue
        (dtype, src), (_, dst) = n.sig.ins[0], n.sig.out
        if n.ins.opcode == "reshape":
            reshapes.setdefault((dtype, src, dst), set()).add(n.sig.key())
        else:
            perm = tuple(n.ins.parsed.get("dimensions", []))
            transposes.setdefault((dtype, src, perm), set()).add(n.sig.key())
    for (dtype, src, dst), firsts in reshapes.items():
        for k1 in firsts:
            for k2 in reshapes.get((dtype, dst, src), ()):
                rows["reshapeback"].append((k1, k2))
    for (dtype, src, perm), firsts in transposes.items():
        inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
        mid = tuple(src[p] for p in perm)
        for k1 in firsts:
            for k2 in transposes.get((dtype, mid, inverse), ()):
                rows["transposeback"].append((k1, k2))

