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
- a float value computed from literals only whose magnitude is not bounded within its type:
  bounds are followed through moves (broadcast, reshape, transpose, slice, concatenate),
  converts, negate/abs, max/min, select, add/subtract and multiply (in real arithmetic, each
  bound checked against the type's largest finite value: finfo(f32).min rounded to bf16, a
  product of huge literals, an s32 iota converted to f16 are not finite); anything else on
  literals only (log(0), 1/0, exp) has no bound;
- an input-dependent value computed by log, sqrt, rsqrt, power, exp, remainder, atan2 or a
  division by anything but a non-zero literal: log(0 * s + mask) is -inf wherever the mask is 0
  on every input, which the model's per-input exclusion cannot cover;
- any value with such an operand (-inf + x, select(m, x, -inf), max(x, -inf) ...).
- an input-dependent value whose literal parts add up past the type's largest value (x plus
  finfo.min twice: -inf on every input of moderate size; ``_offset``).

Everything else (parameters, and values computed from at least one parameter) is finite under
the model. The rows are facts about baseline values only; they claim no relation.

``rlow(b)``  baseline node b never holds +inf or NaN: finite (rfin), or a literal, only moved,
             whose elements are finite or -inf (a causal mask's fill). Written for select
             branches only.

``bcast2x2(k, da, ea, db, eb, kp)``  baseline broadcast k maps its operand's dims da and db to
             its dims ea and eb (both c-divisible); kp is its per-rank signature with those dims
             c times smaller (a [q, k] bias block broadcast over the heads).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from ...hlo.literals import FLOAT_MAX, INT_BITS, LiteralError, read_scalar
from ...hlo.parser import literal_is_elided
from .values import combine_literal_parts

if TYPE_CHECKING:
    from ...ir import Instruction
    from ..graph import Graphs
    from ..signature import Sig

TABLES = ("rfin", "rlow", "bcast2x2")
FLOATS = frozenset(FLOAT_MAX) | {"f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e3m4"}
MOVES = frozenset({"broadcast", "reshape", "transpose", "copy", "slice", "concatenate", "bitcast"})


def _bound(ins: Instruction, bs: list[Fraction | None]) -> Fraction | None:
    """An upper bound on |x| for every element x of a literal-only value, in real arithmetic (a
    rounded result stays within a bound that its type holds: rounding is monotone and the
    type's largest finite value is representable); None when there is none (a non-finite or
    elided literal, division, exp, log ...). Ints and preds are bounded by their type. Bounds
    are exact rationals (no rounding of the bound itself)."""
    dt, op = ins.shape.dtype, ins.opcode
    if dt == "pred":
        return Fraction(1)
    if dt in INT_BITS:
        return Fraction(2 ** INT_BITS[dt])
    if dt not in FLOAT_MAX:
        return None  # fp8 and other float types: not followed
    if op == "constant":
        return _literal_bound(ins)
    if op == "iota":
        d = ins.parsed.get("iota_dimension")
        return Fraction(ins.shape.dims[d]) if isinstance(d, int) and 0 <= d < len(ins.shape.dims) else None
    if any(b is None for b in bs):
        return None
    vals = [b for b in bs if b is not None]
    if op in MOVES or (op in ("convert", "negate", "abs", "copy") and len(vals) == 1):
        return max(vals, default=Fraction(0))
    if op in ("maximum", "minimum") and len(vals) == 2:
        return max(vals)
    if op == "select" and len(vals) == 3:
        return max(vals[1:])
    if op in ("add", "subtract") and len(vals) == 2:
        return vals[0] + vals[1]
    if op == "multiply" and len(vals) == 2:
        return vals[0] * vals[1]
    return None


def _offset(ins: Instruction, ops: list[int], bound: dict[int, Fraction | None], offset: dict[int, Fraction]) -> Fraction:
    """A bound on the magnitude of the literal parts of an input-dependent float value: the
    parts add through add/subtract, scale through multiply (a literal factor, or two offset
    values), and keep their largest through moves, converts, negate/abs, select's branches and
    max/min/clamp; any other op starts afresh (0). Ints carry none (they wrap, never overflow
    to an infinity)."""
    if ins.shape.dtype not in FLOAT_MAX:
        return Fraction(0)

    def part(o: int) -> Fraction:
        return (bound[o] or Fraction(0)) if o in bound else offset.get(o, Fraction(0))

    return combine_literal_parts(ins.opcode, ops, part, MOVES, Fraction(0))


# Ops that give an infinity or NaN from finite operands (log(0), sqrt(-1), exp(100) ...). On an
# input-dependent operand that is the same on every input (log(0 * s + mask): -inf wherever the
# mask is 0) the model's exclusion of such inputs would exclude every input, so their results
# are not finite by construction.
UNBOUNDED_OPS = frozenset({"log", "log-plus-one", "sqrt", "rsqrt", "cbrt", "power", "remainder", "exponential", "exponential-minus-one", "atan2"})


def _unbounded_op(g: Graphs, ins: Instruction, ops: list[int]) -> bool:
    if ins.opcode in UNBOUNDED_OPS:
        return True
    return ins.opcode == "divide" and not (len(ops) == 2 and _nonzero_literal(g, ops[1]))


def _nonzero_literal(g: Graphs, gid: int) -> bool:
    """A literal, only moved, whose every element is finite and not zero (a divisor)."""
    n = g.nodes[gid]
    while n.ins.opcode in MOVES and len(n.operands) == 1:
        n = g.nodes[n.operands[0]]
    b = _literal_bound(n.ins) if n.ins.opcode == "constant" else None
    if b is None:
        return False
    return all(read_scalar(n.ins.shape.dtype, t) != 0 for t in (n.ins.literal or "").replace("{", " ").replace("}", " ").replace(",", " ").split())


def _literal_bound(ins: Instruction) -> Fraction | None:
    text = ins.literal or ""
    if literal_is_elided(text):
        return None
    out = Fraction(0)
    for t in text.replace("{", " ").replace("}", " ").replace(",", " ").split():
        try:
            v = read_scalar(ins.shape.dtype, t)
        except LiteralError:
            return None
        if not isinstance(v, float) or not math.isfinite(v):
            return None
        out = max(out, Fraction(abs(v)))
    return out


def graph_rows(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    if not any(n.side == "distributed" and n.ins.opcode == "collective-permute" for n in g.nodes):
        return  # no ring: rot, and so pexp, never arises
    wanted: set[int] = set()
    for n in g.nodes:
        if n.side == "baseline" and n.ins.opcode == "broadcast" and n.sig is not None and len(n.operands) == 1:
            _bcast_rows(rows, n.sig, [int(v) for v in n.ins.parsed.get("dimensions", [])], g.spec.c)
        if n.side != "baseline" or n.ins.shape.dtype not in FLOATS:
            continue
        if n.ins.opcode == "reduce" and n.operands:
            wanted.add(n.operands[0])
        elif n.ins.opcode == "select" and len(n.operands) == 3:
            wanted.update(n.operands[1:])
    if not wanted:
        return
    # Literal-only values get a bound on their magnitude (None: no bound, maybe not finite);
    # every other value is finite under the model unless an operand may not be.
    bound: dict[int, Fraction | None] = {}
    offset: dict[int, Fraction] = {}  # input-dependent values: a bound on their literal parts (_offset)
    tainted: dict[int, bool] = {}
    for n in g.nodes:  # operands precede their users
        if n.side != "baseline":
            continue
        ins = n.ins
        if ins.opcode == "parameter":
            tainted[n.gid] = False
            continue
        if any(o not in tainted for o in n.operands):
            tainted[n.gid] = True  # an operand not seen yet: unknown
            continue
        if ins.opcode in ("constant", "iota") or (n.operands and all(o in bound for o in n.operands)):
            b = _bound(ins, [bound[o] for o in n.operands])
            if ins.shape.dtype in FLOATS and b is not None and b > Fraction(FLOAT_MAX.get(ins.shape.dtype, 0.0)):
                b = None  # it may round to an infinity: no bound from here on
            bound[n.gid] = b
            tainted[n.gid] = any(tainted[o] for o in n.operands) or (ins.shape.dtype in FLOATS and b is None)
        else:
            # The literal parts of an input-dependent value (a mask's finfo.min added as a bias)
            # overflow on every input of moderate size once their magnitudes add up past the
            # type's largest value (that bias added twice is -inf wherever both mask): such a
            # value is not finite by construction either (tests/soundness_regressions/
            # ring_bias_added_twice_overflows).
            off = offset[n.gid] = _offset(ins, n.operands, bound, offset)
            limit = FLOAT_MAX.get(ins.shape.dtype)
            tainted[n.gid] = any(tainted[o] for o in n.operands) or (limit is not None and off > Fraction(limit)) or (
                ins.shape.dtype in FLOATS and _unbounded_op(g, ins, n.operands))
    for gid in sorted(wanted):
        if tainted.get(gid) is False:
            rows["rfin"].append((gid,))
            rows["rlow"].append((gid,))
        elif _low(g, gid):
            rows["rlow"].append((gid,))


def _low(g: Graphs, gid: int) -> bool:
    """A literal moved only (broadcast, reshape, ...) whose every element is finite or -inf: a
    select's fill that can never be a row's max over a finite element, nor NaN."""
    n = g.nodes[gid]
    while n.ins.opcode in MOVES and len(n.operands) == 1:
        n = g.nodes[n.operands[0]]
    ins = n.ins
    if ins.opcode != "constant" or ins.shape.dtype not in FLOAT_MAX or literal_is_elided(ins.literal or ""):
        return False
    for t in (ins.literal or "").replace("{", " ").replace("}", " ").replace(",", " ").split():
        try:
            v = read_scalar(ins.shape.dtype, t)
        except LiteralError:
            return False
        if not isinstance(v, float) or math.isnan(v) or v == math.inf:
            return False
    return True


def _bcast_rows(rows: dict[str, list[tuple[object, ...]]], sig: Sig, dims: list[int], c: int) -> None:
    src, out = sig.ins[0][1], sig.out[1]
    if len(dims) != len(src) or len(src) < 2:
        return
    for da in range(len(src)):
        for db in range(len(src)):
            ea, eb = dims[da], dims[db]
            if da == db or src[da] % c or src[db] % c or src[da] != out[ea] or src[db] != out[eb]:
                continue
            small_src = tuple(n // c if i in (da, db) else n for i, n in enumerate(src))
            small_out = tuple(n // c if i in (ea, eb) else n for i, n in enumerate(out))
            rows["bcast2x2"].append((sig.key(), da, ea, db, eb, sig.with_dims([small_src], small_out).key()))
