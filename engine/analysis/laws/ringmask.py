"""Tables of rules/ringmask.egg: which baseline float tensors are finite, for the online
softmax's guard (rules/ring.egg: pexp needs every running max it uses finite).

``rfin(b)``  baseline node b holds no infinity or NaN on any input the float model admits
             (README, Semantics: inputs are finite and no operation overflows). Written only for
             the tensors the ring rules read as scores (a float reduce's operand) or as a
             select's branches, and only in programs that shift a ring (a collective-permute).

A tensor is *not* finite-by-construction (no row) when its value depends on a literal that is
not a finite number on every input, which the model's exclusion of overflowing inputs cannot
cover (it would exclude every input):

- a float constant with an infinite or NaN element, or with an elided literal (unknown);
- a float value computed from literals only by anything but moving values (broadcast, reshape,
  transpose, copy, slice, concatenate) or a convert that cannot overflow (to a type whose range
  holds the source's: an int to f32/bf16/f64, f16 to wider): log(0), 1/0, a product of huge
  literals or finfo(f32).min rounded to bf16 are infinite whatever the input;
- an f16 or fp8 iota (its positions may exceed the type's range);
- any value with such an operand (-inf + x, select(m, x, -inf), max(x, -inf) ...).

Everything else (parameters, and values computed from at least one parameter) is finite under
the model. The rows are facts about baseline values only; they claim no relation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...hlo.literals import FLOAT_MAX, INT_BITS, LiteralError, read_scalar
from ...hlo.parser import literal_is_elided

if TYPE_CHECKING:
    from ...ir import Instruction
    from ..graph import Graphs

TABLES = ("rfin",)
FLOATS = frozenset(FLOAT_MAX) | {"f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e3m4"}
MOVES = frozenset({"broadcast", "reshape", "transpose", "copy", "slice", "concatenate", "bitcast"})


def _finite_literal(ins: Instruction) -> bool:
    text = ins.literal or ""
    if literal_is_elided(text):
        return False
    dt = ins.shape.dtype
    if dt not in FLOAT_MAX:
        return False  # fp8 and other float types are not read here: unknown
    for t in text.replace("{", " ").replace("}", " ").replace(",", " ").split():
        try:
            v = read_scalar(dt, t)
        except LiteralError:
            return False
        if not isinstance(v, float) or not math.isfinite(v):
            return False
    return True


def _convert_holds(src: str, dst: str) -> bool:
    """Every finite value of ``src`` converts to a finite value of ``dst``."""
    if dst not in FLOAT_MAX:
        return False
    if src in INT_BITS or src == "pred":
        return (2 ** INT_BITS.get(src, 1)) < FLOAT_MAX[dst]
    return src in FLOAT_MAX and FLOAT_MAX[src] <= FLOAT_MAX[dst]


def graph_rows(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    if not any(n.side == "distributed" and n.ins.opcode == "collective-permute" for n in g.nodes):
        return  # no ring: rot, and so pexp, never arises
    wanted: set[int] = set()
    for n in g.nodes:
        if n.side != "baseline" or n.ins.shape.dtype not in FLOATS:
            continue
        if n.ins.opcode == "reduce" and n.operands:
            wanted.add(n.operands[0])
        elif n.ins.opcode == "select" and len(n.operands) == 3:
            wanted.update(n.operands[1:])
    if not wanted:
        return
    literal: dict[int, bool] = {}  # computed from literals only
    tainted: dict[int, bool] = {}
    for n in g.nodes:  # operands precede their users
        if n.side != "baseline":
            continue
        ins, dt = n.ins, n.ins.shape.dtype
        if ins.opcode == "parameter":
            literal[n.gid], tainted[n.gid] = False, False
            continue
        if ins.opcode == "constant":
            literal[n.gid] = True
            tainted[n.gid] = dt in FLOATS and not _finite_literal(ins)
            continue
        if ins.opcode == "iota":
            literal[n.gid], tainted[n.gid] = True, dt in FLOATS and dt not in ("f32", "f64", "bf16")
            continue
        ops = n.operands
        if any(o not in tainted for o in ops):
            literal[n.gid], tainted[n.gid] = False, True  # an operand not seen yet: unknown
            continue
        lit = all(literal[o] for o in ops)
        bad = any(tainted[o] for o in ops)
        if lit and dt in FLOATS and not bad:
            if ins.opcode == "convert":
                bad = not _convert_holds(g.nodes[ops[0]].ins.shape.dtype, dt)
            else:
                bad = ins.opcode not in MOVES
        literal[n.gid], tainted[n.gid] = lit, bad
    for gid in sorted(wanted):
        if tainted.get(gid) is False:
            rows["rfin"].append((gid,))
