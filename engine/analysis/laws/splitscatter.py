"""Tables of rules/splitscatter.egg: the reshapes around an untiled reduce-scatter.

``splitat(k, e, c)``  reshape k splits dim e of its operand into (c, n/c) in place: the result is
                      src[:e] + (c, src[e] / c) + src[e + 1:] (row-major: element (.., i, j, ..)
                      is operand element (.., i·n/c + j, ..)); c is the group size.
``dropunit(k, e)``    reshape k removes a unit dim at e: src[e] == 1 and the result is
                      src[:e] + src[e + 1:].

Shape facts only (every dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("splitat", "dropunit")
OPCODES = frozenset({"reshape"})

Rows = dict[str, list[tuple[object, ...]]]


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if len(opnd) != 1 or ins.shape.is_tuple:
        return
    src, out = tuple(opnd[0].dims), tuple(ins.shape.dims)
    key = sig.key()
    for e in range(len(src)):
        if c > 1 and src[e] % c == 0 and out == (*src[:e], c, src[e] // c, *src[e + 1 :]):
            rows["splitat"].append((key, e, c))
        if src[e] == 1 and out == (*src[:e], *src[e + 1 :]):
            rows["dropunit"].append((key, e))
