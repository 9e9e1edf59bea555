"""Tables of rules/rankselect.egg (values chosen by comparing the rank with a constant).

``predtof(k)``  a pred -> float convert: true is 1.0 and false 0.0 exactly in every float type.

The compares, selects and rank arithmetic it also reads are rules/slicing.egg's tables.
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig
from .values import FLOAT_PRECISION

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("predtof",)
OPCODES = frozenset(["convert"])


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if opnd and opnd[0].dtype == "pred" and ins.shape.dtype in FLOAT_PRECISION:
        rows["predtof"].append((sig.key(),))
