"""Registry hook of rules/scatter.egg; the family's reading of scatters and its tables live in
engine/analysis/scatter.py (read_scatter also serves graph's supported-op check).

``scatpick``, ``scatrows``, ``scatmask``, ``scatcomb``, ``scatbatch``: one row set per understood
scatter (scatter.scatter_rows); ``catone(k)``: a concatenate of one operand (the identity);
``gplin`` ... ``gppad``: baseline signatures under the rank-group relation, for the group factors
the distributed graph selects with (core.group_factors; scatter.group_partial_rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir import Shape
from ..scatter import SCATTER_TABLES, group_partial_rows, scatter_rows
from ..signature import Sig
from .core import group_factors
from .values import scalar_of

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = SCATTER_TABLES


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None]:
    c = g.spec.c
    factors = group_factors(g)

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None:
            return
        ins = node.ins
        if ins.opcode == "scatter":
            scatter_rows(rows, node.side, sig, ins, opnd, c)
        if ins.opcode == "concatenate" and len(node.operands) == 1:
            rows["catone"].append((key,))
        if node.side == "baseline" and factors:
            # dynamic-update-slice starts that are the integer literal 0
            zeros = [g.nodes[o].ins.opcode == "constant" and scalar_of(g.nodes[o].ins) == 0 for o in node.operands]
            group_partial_rows(rows, sig, ins, [d for _, d in sig.ins], sig.out[1], factors, c, zeros)

    return visit
