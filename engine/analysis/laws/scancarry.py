"""Tables of rules/scancarry.egg: a prefix sum's carry as an exclusive scan of gathered totals.

``prefixwin(k, e)``  reduce-window k (operand, init) with reducer add is the inclusive prefix
                     along e: window size = the dim's extent n, padding (n-1, 0), stride 1, no
                     dilation along e, and the trivial window along every other dim.
``unitdrop(k, e)``   reshape k removes the unit dim e of its operand (the other dims in order).

Side conditions: every window field is checked (a field not understood gives no row); the law's
integer-only condition is in the rules (intsub).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("prefixwin", "unitdrop")
OPCODES = frozenset({"reduce-window", "reshape"})
_TRIVIAL = {"size": "1", "stride": "1", "pad": "0_0", "lhs_dilate": "1", "rhs_dilate": "1"}

Rows = dict[str, list[tuple[object, ...]]]


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if ins.opcode == "reshape" and len(opnd) == 1:
        src, out = tuple(opnd[0].dims), tuple(ins.shape.dims)
        for e in range(len(src)):
            if src[e] == 1 and out == (*src[:e], *src[e + 1 :]):
                rows["unitdrop"].append((sig.key(), e))
        return
    if ins.opcode != "reduce-window" or ins.parsed.get("reducer") != "add" or len(opnd) != 2 or opnd[1].dims != ():
        return
    window = ins.parsed.get("window")
    out = tuple(ins.shape.dims)
    if tuple(opnd[0].dims) != out or not isinstance(window, dict):
        return
    fields = {str(k): str(v).split("x") for k, v in window.items()}
    if set(fields) - set(_TRIVIAL) or "size" not in fields or "pad" not in fields or any(len(v) != len(out) for v in fields.values()):
        return
    for e, n in enumerate(out):
        want = {**_TRIVIAL, "size": str(n), "pad": f"{n - 1}_0"}
        if all(v[e] == want[f] for f, v in fields.items()) and all(v[j] == _TRIVIAL[f] for f, v in fields.items() for j in range(len(out)) if j != e):
            rows["prefixwin"].append((sig.key(), e))
