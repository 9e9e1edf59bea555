"""Tables of rules/packedar.egg: slices of an all-reduce of a concatenation (packed tensors).

``arpick(s, p, a)``      distributed slice s of all-reduce a (one array operand, itself a
                         concatenate along one dim d) takes exactly operand p's range along d,
                         whole along every other dim, stride 1.
``arpickr(s, q, a, L)``  the same with p = reshape(q): L is the plain reshape layout from s's
                         shape to q's (bijection.Layout, its canonical key).

Side conditions: ranges are computed from the operands' extents exactly; an operand used twice
in the concatenation still names one range per position (each slice matches one position).
The all-reduce's reducer and groups are checked by the rules (allreduce table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph import Graphs

TABLES: tuple[str, ...] = ("arpick", "arpickr")

Rows = dict[str, list[tuple[object, ...]]]


def graph_rows(rows: Rows, g: Graphs) -> None:
    for s in g.nodes:
        if s.side != "distributed" or s.ins.opcode != "slice" or len(s.operands) != 1:
            continue
        a = g.nodes[s.operands[0]]
        if a.ins.opcode != "all-reduce" or len(a.operands) != 1 or a.ins.shape.is_tuple:
            continue
        z = g.nodes[a.operands[0]]
        dims = list(z.ins.parsed.get("dimensions", []))
        if z.ins.opcode != "concatenate" or len(dims) != 1:
            continue
        d = int(dims[0])
        sl = [tuple(x) for x in s.ins.parsed.get("slice", [])]
        full = tuple(z.ins.shape.dims)
        if len(sl) != len(full) or any(st != 1 for _, _, st in sl):
            continue
        if any(sl[k] != (0, full[k], 1) for k in range(len(full)) if k != d):
            continue
        lo = 0
        for p in z.operands:
            ext = g.nodes[p].ins.shape.dims[d]
            if (lo, lo + ext) == (sl[d][0], sl[d][1]):
                rows["arpick"].append((s.gid, p, a.gid))
                pn = g.nodes[p]
                if pn.ins.opcode == "reshape" and len(pn.operands) == 1:
                    _reshaped(rows, g, s.gid, pn.operands[0], a.gid)
            lo += ext


def _reshaped(rows: Rows, g: Graphs, s: int, q: int, a: int) -> None:
    from ..bijection import Layout

    src, dst = tuple(g.nodes[s].ins.shape.dims), tuple(g.nodes[q].ins.shape.dims)
    try:
        lay = Layout(src, dst)
    except ValueError:
        return
    rows["arpickr"].append((s, q, a, lay.key()))
