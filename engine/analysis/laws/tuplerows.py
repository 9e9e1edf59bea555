"""Tables of rules/tuplerows.egg: variadic (tuple-shaped) reduces over dims other than the
sharded one, and the elements taken out of their tuples.

``vredrow(k, n, d, e, kp)``  reduce k has n array operands of one shape and n scalar inits,
                      reduces over dims D with d not in D; kp is the same reduce (same
                      reducer computation, dims and types) on operands whose dim d is 1/c as
                      long; every result element sits at dim e = d - |{x in D: x < d}|.
``gterow(k, e, kp)``  get-tuple-element k gives an array whose dim e is c times its extent in
                      kp, the same element index of the tuple (kp: that array 1/c as long on e).
``iotarow(k, d, kp)`` iota k counts along a dim other than d; kp is the same iota with dim d
                      1/c as long (the argmax's index table beside a block of rows).

Side conditions: shape facts only (every dtype); the per-rank signatures keep the reducer /
comparator attributes, so the rule can only pair a reduce with the same computation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..signature import scale

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("vredrow", "gterow", "iotarow")
OPCODES = frozenset({"reduce", "get-tuple-element", "iota"})

Rows = dict[str, list[tuple[object, ...]]]


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    key = sig.key()
    if ins.opcode == "reduce" and ins.shape.is_tuple and len(opnd) >= 4 and len(opnd) % 2 == 0:
        n = len(opnd) // 2
        arrays, inits = opnd[:n], opnd[n:]
        src = tuple(arrays[0].dims)
        if any(tuple(a.dims) != src or a.is_tuple for a in arrays) or any(i.dims != () or i.is_tuple for i in inits):
            return
        dims = sorted(int(x) for x in ins.parsed.get("dimensions", []))
        for d in range(len(src)):
            si = scale(src, d, c)
            if d in dims or not si:
                continue
            e = d - sum(1 for x in dims if x < d)
            kp = sig.with_dims([si] * n + [()] * n).key()
            rows["vredrow"].append((key, n, d, e, kp))
    elif ins.opcode == "iota" and side == "baseline" and not ins.shape.is_tuple:
        out = tuple(ins.shape.dims)
        j = ins.parsed.get("iota_dimension")
        for d in range(len(out)):
            so = scale(out, d, c)
            if so and d != j:
                rows["iotarow"].append((key, d, sig.with_dims(None, so).key()))
    elif ins.opcode == "get-tuple-element" and not ins.shape.is_tuple and ins.tuple_index is not None:
        out = tuple(ins.shape.dims)
        for e in range(len(out)):
            so = scale(out, e, c)
            if so:
                rows["gterow"].append((key, e, sig.with_dims(None, so).key()))
