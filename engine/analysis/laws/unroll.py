"""Tables of rules/unroll.egg (sums of equally sized blocks by an unrolled chain of adds).

``sliceblock(k, d, b, l, n)``  slice k takes exactly block b of the n blocks of l elements along
                               d, whole extents elsewhere (the whole tensor: block 0 of 1).

Side conditions: unit strides only; the blocks divide the dim exactly.
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("sliceblock",)
OPCODES = frozenset(["slice"])


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    rows["sliceblock"].extend(_slice_blocks(sig.key(), ins, opnd[0].dims))


def _slice_blocks(key: str, ins: Instruction, src: tuple[int, ...]) -> list[tuple[object, ...]]:
    """sliceblock rows: the slice takes exactly one block along one dim, whole extents elsewhere."""
    sl = [tuple(x) for x in ins.parsed.get("slice", [])]
    if len(sl) != len(src):
        return []
    cut = [d for d, (a, b, st) in enumerate(sl) if (a, b, st) != (0, src[d], 1)]
    if not cut:
        # The whole tensor (y[0:1] of a rank's single expert): block 0 of 1 along any dim.
        return [(key, d, 0, n, 1) for d, n in enumerate(src) if n > 0]
    if len(cut) != 1:
        return []
    d = cut[0]
    start, limit, stride = sl[d]
    size = limit - start
    if stride != 1 or size <= 0 or src[d] % size or start % size or src[d] // size > 62:
        return []
    return [(key, d, start // size, size, src[d] // size)]

