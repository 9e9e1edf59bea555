"""Tables of rules/scaling.egg (a distributed tensor is a positive rational multiple of a baseline one).

``padop(k)``  k is a pad (a pad with zeros is linear: it commutes with scaling).

Side conditions: the rules check the padding value is the literal zero.
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("padop",)
OPCODES = frozenset(["pad"])


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    rows["padop"].append((sig.key(),))
