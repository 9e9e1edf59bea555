"""Tables of rules/microbatch.egg: a batch cut into n equal microbatches along a dim, each run
through the same row-wise layers, and joined back in order.

For every baseline signature and every block count n that a distributed literal slice cuts
(``sliceblock`` rows, graph._slice_blocks), the signature of the same instruction on one block:

``mbu(k, d, n, kp)``      unary pointwise k on dim d cut into n blocks is kp
``mbb(k, d, n, kp)``      binary pointwise with operands of one shape
``mbbc(k, d, n, kp)``     broadcast whose result dim d is new (no operand dim maps to it)
``mbdot(k, d, n, e, kp)`` dot whose lhs dim d is a free dim (neither batch nor contracting);
                          e is the result dim it becomes
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ops import BINARY_POINTWISE, UNARY_POINTWISE
from ..signature import scale

if TYPE_CHECKING:
    from ..graph import Graphs
    from ..signature import Sig

TABLES: tuple[str, ...] = ("mbu", "mbb", "mbbc", "mbdot")

Rows = dict[str, list[tuple[object, ...]]]


def graph_rows(rows: Rows, g: Graphs) -> None:
    # Only the block counts the distributed program actually cuts, so other programs pay nothing.
    counts = sorted({int(r[4]) for r in rows.get("sliceblock", []) if isinstance(r[4], int) and r[4] > 1})  # type: ignore[arg-type]
    if not counts:
        return
    for node in g.nodes:
        if node.side != "baseline" or node.sig is None:
            continue
        for n in counts:
            _rows(rows, node.sig, node.ins.parsed, n)


def _rows(rows: Rows, sig: Sig, parsed: dict[str, object], n: int) -> None:
    op, k = sig.opcode, sig.key()
    out = sig.out[1]
    ins = [dims for _, dims in sig.ins]
    if op in UNARY_POINTWISE and len(ins) == 1 and ins[0] == out:
        for d in range(len(out)):
            s = scale(out, d, n)
            if s:
                rows["mbu"].append((k, d, n, sig.with_dims([s], s).key()))
    elif op in BINARY_POINTWISE and len(ins) == 2 and ins[0] == ins[1] == out:
        for d in range(len(out)):
            s = scale(out, d, n)
            if s:
                rows["mbb"].append((k, d, n, sig.with_dims([s, s], s).key()))
    elif op == "broadcast" and len(ins) == 1:
        mapped = {int(x) for x in parsed.get("dimensions", [])}  # type: ignore[union-attr]
        for d in range(len(out)):
            s = scale(out, d, n)
            if s and d not in mapped:
                rows["mbbc"].append((k, d, n, sig.with_dims([ins[0]], s).key()))
    elif op == "dot" and len(ins) == 2:
        lb = [int(x) for x in parsed.get("lhs_batch_dims", [])]  # type: ignore[union-attr]
        lc = [int(x) for x in parsed.get("lhs_contracting_dims", [])]  # type: ignore[union-attr]
        lhs, rhs = ins
        lfree = [d for d in range(len(lhs)) if d not in lb and d not in lc]
        for j, d in enumerate(lfree):
            e = len(lb) + j
            sl, so = scale(lhs, d, n), scale(out, e, n)
            if sl and so:
                rows["mbdot"].append((k, d, n, e, sig.with_dims([sl, rhs], so).key()))
