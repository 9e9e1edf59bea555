"""Exact values and type bounds the law families share (not a family: no rules, no tables).

What a scalar literal's value is and which reducers it is an identity of, whether an iota
counts exactly, which int converts keep every value, and the shapes of index_select gathers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ...hlo.literals import FLOAT_MAX, INT_BITS, int_range, scalar_value
from ...hlo.parser import literal_is_elided
from ...ir import Instruction, Module

if TYPE_CHECKING:
    from ..graph import Graphs
    from ..ranges import Ranges

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1  # the range of egglog's i64 column

# Significand precision: every integer of magnitude <= 2**p is exactly representable.
FLOAT_PRECISION = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


def scalar_of(ins: Instruction) -> int | float | None:
    """The exact value of a scalar int or float constant (hlo.literals): an int of its type,
    or the float of its type as a double. None for pred, opaque types and non-scalars."""
    if ins.opcode != "constant" or ins.shape.dims != () or ins.shape.is_tuple:
        return None
    v = scalar_value(ins.shape.dtype, ins.literal)
    return None if isinstance(v, bool) else v


def identity_of(ins: Instruction, value: int | float | None, finite: tuple[bool, bool] = (True, True)) -> list[str]:
    """Reducers this scalar literal is an identity of, compared exactly. For floats the lowest
    finite value counts for max (and the highest for min) when ``finite`` says so (its first
    item for max, its second for min; see finite_extremes): torch lowers amax with it, and it is
    the identity wherever no -inf (+inf) meets a max (min). For ints the type's minimum is the
    identity of max and its maximum that of min (torch's amin/amax on s64 start from them)."""
    if value is None or ins.shape.dims != ():
        return []
    dtype = ins.shape.dtype
    out = []
    if value == 0:
        out.append("add")
    if value == 1:
        out.append("mul")
    if dtype in INT_BITS:
        lo, hi = int_range(dtype)
        if value == lo:
            out.append("max")
        if value == hi:
            out.append("min")
    elif dtype in FLOAT_MAX:
        if value == -math.inf or (finite[0] and value == -FLOAT_MAX[dtype]):
            out.append("max")
        if value == math.inf or (finite[1] and value == FLOAT_MAX[dtype]):
            out.append("min")
    return out


# Ops through which a value's infinities pass element by element, each from one operand.
_INF_MOVES = frozenset({"broadcast", "reshape", "transpose", "copy", "bitcast", "slice", "concatenate", "pad", "select",
                        "dynamic-slice", "dynamic-update-slice", "gather", "reverse", "add", "all-gather", "all-to-all",
                        "collective-permute", "get-tuple-element", "tuple", "all-reduce", "reduce-scatter"})
_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
K = TypeVar("K")  # an operand's key: an instruction name, a node id
N = TypeVar("N")  # a magnitude: float, Fraction
# Values computed by another computation (a folded layer's placeholder is a custom-call).
_OUT_OF_VIEW = frozenset({"custom-call", "fusion", "call", "while", "conditional", "map"})
# Ops that make no infinity from finite operands (on literals: no overflow to fear).
_BOUNDED = frozenset({"sine", "cosine", "tanh", "logistic", "abs", "negate", "floor", "ceil", "round-nearest-afz",
                      "round-nearest-even", "sign", "sqrt", "cbrt", "atan2", "erf", "maximum", "minimum", "clamp"})


def finite_extremes(g: Graphs) -> tuple[bool, bool]:
    """Whether the lowest (highest) finite float is an identity of max (min) in pair ``g``.

    max(x, -FLT_MAX) is x only where x is not -inf. Infinities the inputs make are outside the
    model (README, Semantics), but a program can hold one on every input: a causal mask
    ``select(m, s, -inf)``, an elided literal, literal arithmetic that overflows. So each value
    of both programs gets two flags, "may hold -inf" and "may hold +inf", from those sources:
    non-finite or elided float literals, float arithmetic on literals alone whose range is not
    finite (exp(1000), a narrowing convert of FLT_MAX: ranges.py), a division by a literal-only
    divisor whose range holds 0, a reduce over an empty dim (its init), values computed out of
    view (a folded layer's placeholder, a call). The flags pass through moves, selects and adds
    element by element, through max (min) and subtract as the op does (x - rowmax(x) holds no
    +inf); exp drops -inf; any other op with a flagged operand may hold either. (An infinity the
    inputs' values make, log(x·0) say, is the model's exclusion, as every overflow.) The lowest finite value (or a fill of it) is an identity of
    max in the pair only when it never meets a value that may hold -inf in a max, a clamp or a
    reduce (its init), and no reduce over such values is converted float to float (convmax
    writes the converted reduce with an identity of the new type); likewise the highest and +inf
    for min. Both programs together: the rules pair one side's -FLT_MAX with the other's -inf.
    (tests/soundness_regressions/finite_max_*.) Not traced: a value carried across a segment
    cut (a boundary parameter is taken as finite; the rules of the producing segment do not
    know where it is read): tests/soundness_regressions/finite_max_identity_across_a_layer_cut."""
    got = g.memo.get("finite_extremes")
    if got is not None:
        return got  # type: ignore[no-any-return]
    max_ok = min_ok = True
    for module in (g.baseline, g.distributed):  # (read from the modules: rows are written before every node exists)
        mx, mn = _extremes_meet_infinities(module)
        max_ok, min_ok = max_ok and not mx, min_ok and not mn
    got = g.memo["finite_extremes"] = (max_ok, min_ok)
    return got


def _array_literal_ranges(instructions: list[Instruction]) -> dict[str, tuple[float, float]]:
    """Array literals' exact ranges (ranges.py reads scalar literals only)."""
    seeds = {}
    for ins in instructions:
        vals = _literal_values(ins) if ins.opcode == "constant" and ins.shape.dims and ins.shape.numel <= 1 << 16 else None
        if vals:
            seeds[ins.name] = (min(vals), max(vals))
    return seeds


def divides_by_literal_zero(g: Graphs) -> bool:
    """Whether a float divide of either program has a literal-only divisor whose range holds 0
    (ranges.py): x / 0 is an infinity on every input with x != 0, one the program makes, so the
    law (sum_r a_r) / b = sum_r (a_r / b) (core.py lin2l) does not hold there (+inf + -inf is
    NaN). An input-dependent divisor that is 0 is the model's exclusion, as every overflow."""
    got = g.memo.get("divides_by_literal_zero")
    if got is not None:
        return got  # type: ignore[no-any-return]
    from ..ranges import Ranges

    found = False
    for module in (g.baseline, g.distributed):
        instructions = module.entry.instructions
        lit: dict[str, bool] = {}
        by = {i.name: i for i in instructions}
        ranges: Ranges | None = None
        for ins in instructions:
            ops = ins.operands
            lit[ins.name] = ins.opcode in ("constant", "iota") or (ins.opcode != "parameter" and bool(ops) and all(lit.get(o, False) for o in ops))
            if ins.opcode == "divide" and len(ops) == 2 and ins.shape.dtype in _FLOATS and lit.get(ops[1]):
                ranges = ranges or Ranges(module, _array_literal_ranges(instructions))
                if not _nonzero(by[ops[1]], ranges):
                    found = True
                    break
        if found:
            break
    g.memo["divides_by_literal_zero"] = found
    return found


def _extremes_meet_infinities(module: Module) -> tuple[bool, bool]:
    """(a value that may hold -inf meets a max-like op, one that may hold +inf meets a min-like
    op) in one program (finite_extremes)."""
    from ..ranges import Ranges

    instructions = module.entry.instructions
    ranges = Ranges(module, _array_literal_ranges(instructions))
    neg: dict[str, bool] = {}
    pos: dict[str, bool] = {}
    lit: dict[str, bool] = {}  # computed from literals alone
    reduced: dict[str, list[str]] = {}  # a reduce (or a reshape of one): the values it reduces
    shapes = {i.name: i.shape for i in instructions}
    by = {i.name: i for i in instructions}
    consts = {i.name: i for i in instructions if i.opcode == "constant"}
    ext: dict[str, str] = {}  # "lo" / "hi": the type's lowest / highest finite value, or a fill of it
    # A bound on the magnitude of the literal parts of a value (as rules/ringmask.egg's rfin):
    # x + lowest + lowest is -inf on every input the model admits, though x is an input.
    offset: dict[str, float] = {}
    max_bad = min_bad = False

    def meets(extremes: list[str], values: list[str]) -> None:
        nonlocal max_bad, min_bad
        max_bad = max_bad or ("lo" in extremes and any(neg.get(v, False) for v in values))
        min_bad = min_bad or ("hi" in extremes and any(pos.get(v, False) for v in values))

    for ins in instructions:
        name, ops = ins.name, ins.operands
        dt, op = ins.shape.dtype, ins.opcode
        # Where a finite extreme meets a value: max(x, e), clamp(e, x, e'), reduce(x, e).
        if op in ("maximum", "minimum") and len(ops) == 2:
            meets([ext.get(ops[0], "")], [ops[1]])
            meets([ext.get(ops[1], "")], [ops[0]])
        elif op == "clamp" and len(ops) == 3:
            meets([ext.get(ops[0], ""), ext.get(ops[2], "")], [ops[1]])
        elif op in ("reduce", "reduce-window") and len(ops) >= 2:
            half = len(ops) // 2
            meets([ext.get(o, "") for o in ops[half:]], ops[:half])
        elif op == "convert" and ops and dt in _FLOATS and reduced.get(ops[0]):
            meets(["lo", "hi"], reduced[ops[0]])  # convmax: convert(reduce(y)) = reduce(convert(y), identity)
        if op in ("reduce", "reduce-window") and len(ops) >= 2:
            reduced[name] = ops[: len(ops) // 2]
        elif op in ("reshape", "copy", "bitcast") and ops and ops[0] in reduced:
            reduced[name] = reduced[ops[0]]
        if op in ("broadcast", "reshape", "copy", "transpose", "slice") and len(ops) == 1 and ops[0] in ext:
            ext[name] = ext[ops[0]]
        lit[name] = op in ("constant", "iota") or (op != "parameter" and bool(ops) and all(lit.get(o, False) for o in ops))
        if op == "constant":
            if ins.shape.is_tuple or dt not in _FLOATS:
                continue
            if literal_is_elided(ins.literal):
                neg[name] = pos[name] = True
                continue
            text = (ins.literal or "").lower()
            neg[name] = "-inf" in text
            pos[name] = "inf" in text.replace("-inf", "")
            v = scalar_value(dt, ins.literal) if ins.shape.dims == () else None
            if isinstance(v, float) and abs(v) == FLOAT_MAX[dt]:
                ext[name] = "lo" if v < 0 else "hi"
            continue
        if op == "parameter":
            continue  # an input (finite: README, Semantics), or a segment's boundary (see above)
        if not ins.shape.is_tuple and dt not in _FLOATS:
            continue
        a = [neg.get(o, False) for o in ops]
        b = [pos.get(o, False) for o in ops]
        offset[name] = _literal_offset(ins, ops, lit, offset, by, ranges)
        if not lit[name] and dt in FLOAT_MAX and offset[name] > FLOAT_MAX[dt]:
            neg[name] = pos[name] = True  # its literal parts alone overflow the type
            continue
        reducer = ins.parsed.get("reducer")
        src = shapes.get(ops[0]) if ops else None
        if op == "convert" and src is not None and (not _may_overflow(src.dtype, dt) or _fits(consts.get(ops[0]), dt)):
            neg[name], pos[name] = any(a), any(b)
        elif op == "divide" and len(ops) == 2 and lit.get(ops[1]) and not _nonzero(by[ops[1]], ranges):
            neg[name] = pos[name] = True  # x / 0: an infinity on every input with x != 0
        elif op == "subtract" and len(ops) == 2 and _row_max_of(by.get(ops[1]), ops[0], by):
            neg[name], pos[name] = a[0] or b[1], False  # x - max(x) over x's rows: <= 0 (NaN on a row of -inf; -inf from an init of +inf)
        elif op == "subtract" and len(ops) == 2:
            neg[name], pos[name] = a[0] or b[1], b[0] or a[1]
        elif op in _OUT_OF_VIEW or (lit[name] and op not in _INF_MOVES and op not in _BOUNDED and not _literal_finite(ins, ranges)):
            neg[name] = pos[name] = True  # computed out of view, or literal arithmetic that may overflow
        elif op == "reduce" and src is not None and any(src.dims[int(d)] == 0 for d in ins.parsed.get("dimensions", []) if 0 <= int(d) < len(src.dims)):
            neg[name], pos[name] = any(a), any(b)  # an empty window gives the init itself
        elif op == "maximum" or (op == "reduce" and reducer == "max" and len(ops) == 2):
            neg[name], pos[name] = all(a), any(b)
        elif op == "minimum" or (op == "reduce" and reducer == "min" and len(ops) == 2):
            neg[name], pos[name] = any(a), all(b)
        elif op == "exponential":
            neg[name], pos[name] = False, any(b)
        elif op in _INF_MOVES:
            neg[name], pos[name] = any(a), any(b)
        elif any(a) or any(b):
            neg[name] = pos[name] = True
    return max_bad, min_bad


def _literal_offset(ins: Instruction, ops: list[str], lit: dict[str, bool], offset: dict[str, float], by: dict[str, Instruction], ranges: Ranges) -> float:
    """The literal parts' magnitude bound of a float value (finite_extremes): they add through
    add/subtract, scale through multiply, keep their largest through moves, converts, negate,
    abs, select's branches and max/min/clamp; any other op starts afresh."""
    if ins.shape.is_tuple or ins.shape.dtype not in FLOAT_MAX:
        return 0.0

    def part(o: str) -> float:
        if lit.get(o) and o in by and by[o].shape.dtype in FLOAT_MAX and not by[o].shape.is_tuple:
            lo, hi = ranges.of(by[o])
            m = max(abs(float(lo)), abs(float(hi)))
            return m if math.isfinite(m) else 0.0  # an infinite literal is flagged as such (neg/pos)
        return offset.get(o, 0.0)

    return combine_literal_parts(ins.opcode, ops, part, _INF_MOVES, 0.0)


def combine_literal_parts(op: str, ops: list[K], part: Callable[[K], N], moves: frozenset[str], zero: N) -> N:
    """The literal parts' magnitude bound of an op's result from its operands' (``part``): they
    add through add/subtract, scale through multiply, keep their largest through ``moves``,
    converts, negate/abs, select's branches and max/min/clamp; any other op starts afresh
    (``zero``). Shared by finite_extremes (floats over instruction names) and rules/ringmask.egg's
    rfin (exact fractions over node ids)."""
    if op in ("add", "subtract") and len(ops) == 2:
        return part(ops[0]) + part(ops[1])  # type: ignore[operator, no-any-return]
    if op == "multiply" and len(ops) == 2:
        return part(ops[0]) * part(ops[1])  # type: ignore[operator, no-any-return]
    if op == "select" and len(ops) == 3:
        return max(part(ops[1]), part(ops[2]))  # type: ignore[type-var]
    if op in moves or op in ("convert", "negate", "abs", "maximum", "minimum", "clamp"):
        return max((part(o) for o in ops), default=zero)  # type: ignore[type-var]
    return zero


def _nonzero(ins: Instruction, ranges: Ranges) -> bool:
    """A literal-only divisor whose range (ranges.py) excludes zero."""
    lo, hi = ranges.of(ins)
    return bool(lo > 0 or hi < 0)


def _row_max_of(b: Instruction | None, x: str, by: dict[str, Instruction]) -> bool:
    """``b`` spreads reduce_max(x) back over x's shape along the reduced dims (softmax's
    x - max(x)): broadcast(reduce(x, dims R), dimensions = the dims not in R), or a broadcast
    of a reshape of it that only inserts those unit dims."""
    if b is None or b.opcode != "broadcast" or len(b.operands) != 1 or b.shape != by[x].shape:
        return False
    q = by.get(b.operands[0])
    bd = [int(d) for d in b.parsed.get("dimensions", [])]
    n = len(b.shape.dims)
    if q is not None and q.opcode == "reshape" and len(q.operands) == 1 and bd == list(range(n)):
        r = by.get(q.operands[0])
        if r is None or r.opcode != "reduce":
            return False
        red = [int(d) for d in r.parsed.get("dimensions", [])]
        keep = tuple(1 if d in red else b.shape.dims[d] for d in range(n))
        if tuple(q.shape.dims) != keep:
            return False
    else:
        r = q
        if r is None or r.opcode != "reduce":
            return False
        red = [int(d) for d in r.parsed.get("dimensions", [])]
        if bd != [d for d in range(n) if d not in red]:
            return False
    return r.parsed.get("reducer") == "max" and len(r.operands) == 2 and r.operands[0] == x


def _literal_finite(ins: Instruction, ranges: Ranges) -> bool:
    """A float computed from literals alone whose value range (ranges.py: exact literals,
    interval arithmetic) is finite with room to spare in its type; power (inv_freq =
    base^(-2i/d) of rotary tables) from its operands' ranges, for a positive base."""
    dt = ins.shape.dtype
    if dt not in FLOAT_MAX:
        return False
    if ins.opcode == "power" and len(ins.operands) == 2:
        a, e = (ranges.of(ranges.module.entry[o]) for o in ins.operands)
        if not (a[0] > 0 and all(math.isfinite(v) for v in (*a, *e))):
            return False
        try:
            corners = [x**y for x in a for y in e]
        except OverflowError:
            return False
        lo, hi = min(corners), max(corners)
        ranges.memo[ins.name] = (lo, hi)  # (what ranges.py does not compute; its users read it)
    else:
        lo, hi = ranges.of(ins)
    return all(math.isfinite(v) and abs(v) <= FLOAT_MAX[dt] / 2 for v in (lo, hi))


def _literal_values(ins: Instruction) -> list[float] | None:
    """The values of int or float constant ``ins`` printed in full, all finite (else None)."""
    if ins.shape.is_tuple or literal_is_elided(ins.literal) or (ins.shape.dtype not in FLOAT_MAX and ins.shape.dtype not in INT_BITS):
        return None
    try:
        vals = [float(t) for t in (ins.literal or "").replace("{", " ").replace("}", " ").replace(",", " ").split()]
    except ValueError:
        return None
    return vals if vals and all(math.isfinite(v) for v in vals) else None


def _fits(ins: Instruction | None, dst: str) -> bool:
    """Every value of constant ``ins`` (printed in full) is finite and at most ``dst``'s largest
    finite value in magnitude, so converting it gives no infinity."""
    vals = _literal_values(ins) if ins is not None else None
    return vals is not None and dst in FLOAT_MAX and all(abs(v) <= FLOAT_MAX[dst] for v in vals)


def _may_overflow(src: str, dst: str) -> bool:
    """A convert from ``src`` to float ``dst`` can round a finite value to an infinity: a float
    narrowed (FLT_MAX rounds to bf16's inf), an int of more than 16 bits into f16."""
    order = {"f16": 0, "bf16": 1, "f32": 2, "f64": 3}
    if dst not in order:
        return False
    if src in order:
        return order[dst] < order[src]
    return dst == "f16" and src in INT_BITS and INT_BITS[src] > 16


def iota_exact(dtype: str, n: int) -> bool:
    """An iota of ``n`` elements along its dim holds exactly 0 .. n-1 in ``dtype``: for an int
    type n - 1 is at most the type's largest value (else it wraps: s8 counts 127, -128, ...),
    for a float type at most 2^(significand bits) (else rounding repeats values)."""
    if dtype in INT_BITS:
        return n - 1 <= int_range(dtype)[1]
    p = FLOAT_PRECISION.get(dtype)
    return p is not None and n - 1 <= 1 << p


def widens(a: str, b: str) -> bool:
    """Every value of int type a is representable in int type b."""
    if a not in INT_BITS or b not in INT_BITS:
        return False
    if a[0] == b[0]:
        return INT_BITS[b] >= INT_BITS[a]
    return a[0] == "u" and b[0] == "s" and INT_BITS[b] > INT_BITS[a]


def int_bounds(dtype: str) -> tuple[int, int]:
    """[lo, hi] within the int type's values (capped to ±2^62 so that egglog's i64 bounds
    arithmetic has room; a narrower range only loses proofs)."""
    if dtype[0] == "u":
        return 0, int_top(dtype)
    return -int_top(dtype) - 1 if INT_BITS[dtype] < 64 else -(1 << 62), int_top(dtype)


def int_top(dtype: str) -> int:
    """The largest value of an int type (capped: egglog's i64)."""
    bits = INT_BITS[dtype] - (1 if dtype[0] == "s" else 0)
    return (1 << min(bits, 62)) - 1


def shape_text(dtype: str, dims: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


def index_select_dim(ins: Instruction, src: tuple[int, ...], idx: tuple[int, ...]) -> int | None:
    """d when gather ``ins`` is index_select along d with one index: out = x[i] along d, kept as
    a unit dim at d (indices of one element, each a scalar start along d; whole slices of every
    other dim, which keep their places)."""
    p = ins.parsed
    if len(idx) != 1 or idx[0] != 1 or p.get("index_vector_dim") != 1:
        return None
    collapsed = list(p.get("collapsed_slice_dims", []))
    if len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
        return None
    d = collapsed[0]
    if not 0 <= d < len(src):
        return None
    if list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
        return None
    if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or ins.shape.dims != tuple(1 if i == d else n for i, n in enumerate(src)):
        return None
    if any(k in p for k in ("operand_batching_dims", "start_indices_batching_dims")) and (p.get("operand_batching_dims") or p.get("start_indices_batching_dims")):
        return None
    return d


def arange_start(ins: Instruction) -> int | None:
    """b when the 1-D int constant ``ins`` is b, b+1, ..., b+n-1 (an arange literal)."""
    if ins.shape.dtype not in INT_BITS or len(ins.shape.dims) != 1 or literal_is_elided(ins.literal):
        return None
    text = (ins.literal or "").strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        vals = [int(v) for v in text[1:-1].replace(" ", "").split(",") if v]
    except ValueError:
        return None
    if len(vals) != ins.shape.dims[0] or not vals or any(v != vals[0] + i for i, v in enumerate(vals)):
        return None
    return vals[0] if I64_MIN <= vals[0] <= I64_MAX else None

