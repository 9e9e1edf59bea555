"""Table of rules/dotblock.egg: a dot cut along a free dim of each operand.

``dotblk(kb, u, v, u2, v2, kd)``  baseline dot kb; u a free dim of its lhs (neither batch nor
                                 contracting), v a free dim of its rhs, both extents divisible
                                 by c; u2, v2 the result dims they become (XLA orders the result
                                 as batch dims, lhs free dims, rhs free dims); kd the same dot with
                                 u, v, u2, v2 divided by c.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..signature import scale

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("dotblk",)
OPCODES = frozenset({"dot"})


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if side != "baseline" or ins.opcode != "dot" or len(opnd) != 2:
        return
    p = ins.parsed
    lb, lc = [int(x) for x in p.get("lhs_batch_dims", [])], [int(x) for x in p.get("lhs_contracting_dims", [])]
    rb, rc = [int(x) for x in p.get("rhs_batch_dims", [])], [int(x) for x in p.get("rhs_contracting_dims", [])]
    lhs, rhs, out = tuple(opnd[0].dims), tuple(opnd[1].dims), tuple(ins.shape.dims)
    lfree = [d for d in range(len(lhs)) if d not in lb and d not in lc]
    rfree = [d for d in range(len(rhs)) if d not in rb and d not in rc]
    if len(out) != len(lb) + len(lfree) + len(rfree):
        return
    for i, u in enumerate(lfree):
        for j, v in enumerate(rfree):
            u2, v2 = len(lb) + i, len(lb) + len(lfree) + j
            sl, sr, so = scale(lhs, u, c), scale(rhs, v, c), scale(out, u2, c)
            so = scale(so, v2, c) if so is not None else None
            if sl and sr and so:
                rows["dotblk"].append((sig.key(), u, v, u2, v2, sig.with_dims([sl, sr], so).key()))
