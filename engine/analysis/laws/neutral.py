"""Table of rules/neutral.egg (neutral elements of bitwise or and integer subtraction).

``intsub(k)``  k is ``subtract`` on an integer element type (never float: x - (-0.0) is not x
               for x = -0.0, and the zero table reads -0.0 as zero). ``or`` reuses the orop
               table every graph already writes (pred and int types).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...hlo.literals import INT_BITS

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("intsub",)
OPCODES = frozenset({"subtract"})


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if ins.opcode == "subtract" and ins.shape.dtype in INT_BITS and all(s.dtype == ins.shape.dtype for s in opnd):
        rows["intsub"].append((sig.key(),))
