"""Tables of rules/gathercat.egg (gather along one dim, chunk, concatenate along another).

``catdim(k, d)``  k concatenates along d.

Side conditions: none beyond the shapes (values only move).
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("catdim",)
OPCODES = frozenset(["concatenate"])


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    dims = ins.parsed.get("dimensions", [])
    if len(dims) == 1:
        rows["catdim"].append((sig.key(), int(dims[0])))
