"""Tables of rules/clampgather.egg: integer clamps (whose bounds the rules may show never act)
and reduces over unit dims from their reducer's identity (which keep their operand's elements).

``clampid(z, a, x, b)``  node z is ``clamp(a, x, b)`` on an integer element type (never float:
                         NaN and -0.0 make min/max of equal-looking bounds differ).
``unitred(z, m)``        node z is a reduce of m over dims that all have extent 1 from an init
                         literal that is the identity of its (plain) reducer, on pred or an
                         integer type: z holds m's elements in m's order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...hlo.literals import INT_BITS

if TYPE_CHECKING:
    from ..graph import Graphs

TABLES = ("clampid", "unitred")

Rows = dict[str, list[tuple[object, ...]]]


def _identity(reducer: str, dtype: str) -> str | None:
    """The literal text of ``reducer``'s identity in ``dtype`` (None: no identity we read)."""
    if dtype == "pred":
        return {"or": "false", "and": "true"}.get(reducer)
    bits = INT_BITS[dtype]
    signed = dtype[0] == "s"
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return {"add": "0", "or": "0", "max": str(lo), "min": str(hi), "and": str(-1 if signed else hi)}.get(reducer)


def graph_rows(rows: Rows, g: Graphs) -> None:
    for n in g.nodes:
        ins = n.ins
        dt = ins.shape.dtype
        if ins.shape.is_tuple or not (dt in INT_BITS or dt == "pred"):
            continue
        if ins.opcode == "clamp" and len(n.operands) == 3 and dt in INT_BITS:
            if all(g.nodes[o].ins.shape.dtype == dt for o in n.operands):
                rows["clampid"].append((n.gid, *n.operands))
        elif ins.opcode == "reduce" and len(n.operands) == 2:
            src, init = (g.nodes[o].ins for o in n.operands)
            dims = [int(d) for d in ins.parsed.get("dimensions", [])]
            reducer = ins.parsed.get("reducer")
            if src.shape.dtype != dt or not dims or any(not 0 <= d < src.shape.rank or src.shape.dims[d] != 1 for d in dims):
                continue
            want = _identity(str(reducer), dt)
            if want is not None and init.opcode == "constant" and init.shape.rank == 0 and (init.literal or "").strip() == want:
                rows["unitred"].append((n.gid, n.operands[0]))
