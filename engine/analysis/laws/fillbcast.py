"""Table of rules/fillbcast.egg: the broadcasts of arrays, through which fills of 1 and 0 pass.

``bcastarr(k)``  k is a ``broadcast`` whose operand has at least one dim (broadcasts of scalars
                 are rules/algebra.egg's fillop already). A broadcast only repeats elements, so
                 the law holds for every element type and every dims mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("bcastarr",)
OPCODES = frozenset({"broadcast"})


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if ins.opcode == "broadcast" and len(opnd) == 1 and opnd[0].rank >= 1 and not opnd[0].is_tuple:
        rows["bcastarr"].append((sig.key(),))
