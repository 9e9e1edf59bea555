"""Tables of rules/ring.egg (2-D blocks of ring attention, online softmax) read per instruction.

``ringop(k, op)``  float subtract or exponential k (the online-softmax rescale);
``bcastlead(k)``   broadcast k keeps its operand's dims as its leading dims (a row value repeated
                   along trailing dims).

The 2-D block shape rows (dotfree2, moves1x2, reduces2, moves2x2, bcast2, dotc2, dotrows) are
core.Tables'. Side conditions: ringop only for float types (the rescale's law is real
arithmetic; the rules bound it by the float model of rules/ring.egg).
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig
from .values import FLOAT_PRECISION

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("ringop", "bcastlead")
OPCODES = frozenset(["broadcast", "exponential", "subtract"])


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    op = ins.opcode
    if op in ("subtract", "exponential") and ins.shape.dtype in FLOAT_PRECISION:
        rows["ringop"].append((sig.key(), op))
    if op == "broadcast" and opnd and list(ins.parsed.get("dimensions", [])) == list(range(len(opnd[0].dims))):
        rows["bcastlead"].append((sig.key(),))
