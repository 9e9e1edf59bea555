"""Table of rules/reshapeback.egg: a baseline reshape A -> B and a distributed reshape B -> A.

``rback(kb, kd)``  kb the signature of a baseline reshape from shape A to shape B, kd that of a
                   distributed reshape from B back to A, one element type throughout. A reshape
                   signature fixes both shapes, so the pair says kd undoes kb exactly.

Cost: one pass over the nodes' opcodes; rows only for such pairs (most programs have few), and
a program without one loads no rule of the family (egg.program's input tables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph import Graphs

Rows = dict[str, list[tuple[object, ...]]]

TABLES: tuple[str, ...] = ("rback",)


def graph_rows(rows: Rows, g: Graphs) -> None:
    # (dtype, from dims, to dims) -> signature keys, per side.
    seen: dict[str, dict[tuple[str, tuple[int, ...], tuple[int, ...]], set[str]]] = {"baseline": {}, "distributed": {}}
    for n in g.nodes:
        if n.ins.opcode != "reshape" or n.sig is None or len(n.operands) != 1:
            continue
        src = g.nodes[n.operands[0]].ins.shape
        if src.is_tuple or n.ins.shape.is_tuple or src.dtype != n.ins.shape.dtype:
            continue
        seen[n.side].setdefault((src.dtype, tuple(src.dims), tuple(n.ins.shape.dims)), set()).add(n.sig.key())
    for (dtype, a, b), kbs in seen["baseline"].items():
        for kd in seen["distributed"].get((dtype, b, a), ()):
            rows["rback"] += [(kb, kd) for kb in sorted(kbs)]
