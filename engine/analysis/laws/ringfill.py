"""Tables of rules/ringfill.egg.

``sel2(k, da, db, kp)``     baseline select k whose operands all have k's shape; kp its per-rank
                            signature with dims da and db (da != db) c times smaller.
``unitlift(kp, e, k, e2)``  distributed reshape kp that only inserts or drops unit dims (the
                            other extents in the same order); k the same reshape with dim e of
                            its operand (dim e2 of its result) c times larger.
``unitback(k, kb)``         k such a baseline reshape, kb the reshape back to k's operand shape
                            (any reshape followed by the reshape back to its operand's shape is
                            the identity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("sel2", "unitlift", "unitback")
OPCODES = frozenset({"select", "reshape"})


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    dims = tuple(ins.shape.dims)
    if ins.opcode == "reshape":
        if side == "distributed" and len(opnd) == 1:
            _unitlift(rows, sig, tuple(opnd[0].dims), dims, c)
        return
    if side != "baseline" or len(opnd) != 3 or any(tuple(o.dims) != dims for o in opnd):
        return
    for da in range(len(dims)):
        for db in range(len(dims)):
            if da == db or dims[da] % c or dims[db] % c:
                continue
            s = list(dims)
            s[da] //= c
            s[db] //= c
            small = tuple(s)
            rows["sel2"].append((sig.key(), da, db, sig.with_dims([small, small, small], small).key()))


def _unitlift(rows: dict[str, list[tuple[object, ...]]], sig: Sig, src: tuple[int, ...], out: tuple[int, ...], c: int) -> None:
    a = [i for i, n in enumerate(src) if n != 1]
    b = [i for i, n in enumerate(out) if n != 1]
    if [src[i] for i in a] != [out[i] for i in b]:
        return
    for e, e2 in zip(a, b, strict=True):
        big_src, big_out = list(src), list(out)
        big_src[e] *= c
        big_out[e2] *= c
        big = sig.with_dims([tuple(big_src)], tuple(big_out)).key()
        rows["unitlift"].append((sig.key(), e, big, e2))
        rows["unitback"].append((big, sig.with_dims([tuple(big_out)], tuple(big_src)).key()))
