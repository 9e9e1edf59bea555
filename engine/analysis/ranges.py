"""Value ranges of instructions, for the one question the analysis needs them for: does a
float->int convert only ever see values inside the int type (where its result is the truncated
value, the same in every program), or may it see others (implementation-defined: XLA:CPU gives
different results for the same out-of-range value in differently vectorized programs)?

``value_range`` returns an interval [lo, hi] that holds every value an instruction takes on
every input, for int and float element types; endpoints may be ±inf (unbounded). Literals are
read exactly (hlo.literals). Interval arithmetic covers the ops bounded values flow through in
practice (int->float converts of positions, clamps, min/max, abs, floor/ceil/round, the four
arithmetic ops, log/exp/sqrt/tanh/logistic, select, and the ops that only move values).
Converts round their endpoints to the type (rounding is monotone); the endpoints of rounded
arithmetic are widened by a few ulps of the type, so a computed bound is never tighter than
the true one. NaN: a NaN makes no interval (an
operation that may produce one, inf - inf say, is unbounded), and NaN inputs are outside the
proof (README, Semantics): a verified pair agrees where neither program makes a NaN.
Integer ops whose exact result may leave the type wrap: their range is the whole type, and
so is an integer iota longer than its type holds (s8[256] wraps to -128..-1 after 127).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..hlo.literals import FLOAT_MAX, INT_BITS, int_range, round_to, scalar_value
from ..ir import Instruction, Module

Range = tuple[float, float]  # int endpoints (exact) for int types, floats (maybe ±inf) for floats
FULL: Range = (-math.inf, math.inf)
MAX_DEPTH = 48


# Relative widening after a rounded float op: 4 ulps of the type (the op rounds by half an ulp,
# our endpoint arithmetic in doubles by half an ulp of f64), plus the smallest denormal.
_SLACK = {"f16": 2.0**-8, "bf16": 2.0**-5, "f32": 2.0**-21, "f64": 2.0**-50}
_ARITH = frozenset({"add", "subtract", "multiply", "divide", "log", "exponential", "sqrt"})


def _widen(dtype: str, r: Range) -> Range:
    lo, hi = r
    e = _SLACK[dtype]
    return (lo - abs(lo) * e - 5e-324 if math.isfinite(lo) else lo, hi + abs(hi) * e + 5e-324 if math.isfinite(hi) else hi)


def _type_range(dtype: str) -> Range:
    if dtype in INT_BITS:
        return int_range(dtype)
    if dtype == "pred":
        return (0, 1)
    return FULL


def _clip(dtype: str, r: Range) -> Range:
    """An int op's exact result range, or the whole type when it may wrap; a float's range
    beyond the type's largest value becomes ±inf (the op overflows to infinity there)."""
    if dtype in INT_BITS:
        tlo, thi = _type_range(dtype)
        return r if tlo <= r[0] and r[1] <= thi else (tlo, thi)
    if dtype in FLOAT_MAX:
        m = FLOAT_MAX[dtype]
        return (r[0] if r[0] >= -m else -math.inf, r[1] if r[1] <= m else math.inf)
    return r


def _mul(a: Range, b: Range) -> Range | None:
    prods = []
    for x in a:
        for y in b:
            p = x * y
            if math.isnan(p):  # 0 * inf: unbounded (or NaN)
                return None
            prods.append(p)
    return (min(prods), max(prods))


def _div(a: Range, b: Range) -> Range | None:
    if b[0] <= 0 <= b[1]:
        return None  # a divisor that may be 0 (or change sign): unbounded
    return _mul(a, (1 / b[1], 1 / b[0]))


def _safe(f: Callable[[float], float], x: float, below: float) -> float:
    try:
        return f(x)
    except (OverflowError, ValueError):
        return below


class Ranges:
    """value_range with a memo, for one module."""

    def __init__(self, module: Module, seeds: dict[str, Range] | None = None) -> None:
        """``seeds``: known ranges of entry parameters by name (the rank input: [0, c - 1])."""
        self.module = module
        self.seeds: dict[str, Range] = dict(seeds or {})
        self.memo: dict[str, Range] = dict(seeds or {})

    def of(self, ins: Instruction, depth: int = 0) -> Range:
        got = self.memo.get(ins.name)
        if got is not None:
            return got
        r = self._compute(ins, depth) if depth < MAX_DEPTH else FULL
        r = _type_range(ins.shape.dtype) if r is None else r
        if ins.shape.dtype in INT_BITS:
            tlo, thi = _type_range(ins.shape.dtype)
            r = (max(r[0], tlo), min(r[1], thi))
        elif ins.shape.dtype in FLOAT_MAX and ins.opcode in _ARITH:
            r = _clip(ins.shape.dtype, _widen(ins.shape.dtype, r))
        self.memo[ins.name] = r
        return r

    def _compute(self, ins: Instruction, depth: int) -> Range | None:
        op, dtype = ins.opcode, ins.shape.dtype
        if dtype not in INT_BITS and dtype not in FLOAT_MAX:
            return None
        if op == "constant":
            v = scalar_value(dtype, ins.literal) if not ins.shape.dims else None
            if v is None or isinstance(v, bool) or (isinstance(v, float) and math.isnan(v)):
                return None
            return (v, v)
        if op == "iota":
            d = ins.parsed.get("iota_dimension")
            if isinstance(d, int) and 0 <= d < len(ins.shape.dims):
                top = max(ins.shape.dims[d] - 1, 0)
                if dtype in INT_BITS and top > int_range(dtype)[1]:
                    return None  # the iota wraps (s8[256]: 0..127, -128..-1): the whole type
                return (0, top)
            return None
        src = [self.module.entry.get(o) for o in ins.operands]
        if not src or any(s is None for s in src):
            return None
        rs = [self.of(s, depth + 1) for s in src]  # type: ignore[arg-type]
        a = rs[0]
        if op in ("reshape", "broadcast", "copy", "transpose", "slice", "reverse", "dynamic-slice", "gather"):
            return a
        if op == "convert":
            s = src[0]
            assert s is not None
            if s.shape.dtype == "pred":
                return (0, 1)
            if dtype in FLOAT_MAX:
                # Rounding to the type is monotone: the rounded endpoints bound the rounded values.
                return (round_to(dtype, float(a[0])), round_to(dtype, float(a[1])))
            # int destination: exact when the source range fits (truncation toward zero).
            lo, hi = math.trunc(a[0]) if math.isfinite(a[0]) else a[0], math.trunc(a[1]) if math.isfinite(a[1]) else a[1]
            return _clip(dtype, (lo, hi))
        if op == "concatenate":
            return (min(r[0] for r in rs), max(r[1] for r in rs))
        if op == "select" and len(rs) == 3:
            return (min(rs[1][0], rs[2][0]), max(rs[1][1], rs[2][1]))
        if op == "clamp" and len(rs) == 3:
            lo, x, hi = rs  # clamp(lo, x, hi) = min(max(x, lo), hi)
            return (min(max(x[0], lo[0]), hi[0]), min(max(x[1], lo[1]), hi[1]))
        if op == "maximum" and len(rs) == 2:
            return (max(rs[0][0], rs[1][0]), max(rs[0][1], rs[1][1]))
        if op == "minimum" and len(rs) == 2:
            return (min(rs[0][0], rs[1][0]), min(rs[0][1], rs[1][1]))
        if op == "negate":
            return _clip(dtype, (-a[1], -a[0]))
        if op == "abs":
            lo = 0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))
            return _clip(dtype, (lo, max(abs(a[0]), abs(a[1]))))
        if op in ("floor", "ceil", "round-nearest-afz", "round-nearest-even"):
            return (math.floor(a[0]) if math.isfinite(a[0]) else a[0], math.ceil(a[1]) if math.isfinite(a[1]) else a[1])
        if op == "add" and len(rs) == 2:
            lo, hi = a[0] + rs[1][0], a[1] + rs[1][1]
            return None if math.isnan(lo) or math.isnan(hi) else _clip(dtype, (lo, hi))
        if op == "subtract" and len(rs) == 2:
            lo, hi = a[0] - rs[1][1], a[1] - rs[1][0]
            return None if math.isnan(lo) or math.isnan(hi) else _clip(dtype, (lo, hi))
        if op == "multiply" and len(rs) == 2:
            m = _mul(a, rs[1])
            return None if m is None else _clip(dtype, m)
        if op == "divide" and len(rs) == 2 and dtype in FLOAT_MAX:
            q = _div(a, rs[1])
            return None if q is None else _clip(dtype, q)
        if dtype not in FLOAT_MAX:
            return None
        if op == "log":
            # log of a negative value is NaN (outside the proof); log(0) = -inf.
            lo = _safe(math.log, a[0], -math.inf) if a[0] > 0 else -math.inf
            hi = _safe(math.log, a[1], math.inf) if a[1] > 0 else -math.inf
            return (lo, hi)
        if op == "exponential":
            # Endpoints rounded to the type (monotone): exp(-200) is 0 in f32, not 1e-87.
            return (round_to(dtype, _safe(math.exp, a[0], 0.0)), round_to(dtype, _safe(math.exp, a[1], math.inf)) if a[1] < math.inf else math.inf)
        if op == "power" and len(rs) == 2 and a[0] > 0 and all(math.isfinite(v) for v in (*a, *rs[1])):
            # a^b = exp(b·ln a) with a > 0: b·ln a is bilinear, so its extremes over the box of
            # the ranges are at the corners; rounded to the type (10000^-50 underflows to 0 in
            # f32) and widened by the op's rounding.
            try:
                corners = [math.pow(x, y) for x in a for y in rs[1]]
            except OverflowError:
                return None
            return _widen(dtype, (round_to(dtype, min(corners)), round_to(dtype, max(corners))))
        if op == "sqrt":
            return (math.sqrt(max(a[0], 0.0)), math.sqrt(a[1]) if a[1] >= 0 else 0.0)
        if op == "tanh":
            return (-1.0, 1.0)
        if op == "logistic":
            return (0.0, 1.0)
        return None


def fits_int(ranges: Ranges, src: Instruction, dtype: str) -> bool:
    """Every value of float ``src`` converts to int ``dtype`` in range: truncated toward zero,
    it lies in [type min, type max], i.e. the value lies strictly inside (min - 1, max + 1)."""
    if dtype not in INT_BITS:
        return False
    lo, hi = ranges.of(src)
    tlo, thi = int_range(dtype)
    return float(tlo) - 1 < lo and hi < float(thi) + 1


# Ops that map element e of their same-shaped operands to element e of their result (and
# nothing else): a value range restricted on the elements where a predicate holds stays valid
# through them, element for element.
_ELEMENTWISE = frozenset({"add", "subtract", "multiply", "divide", "minimum", "maximum", "abs", "negate", "convert", "log",
                          "exponential", "sqrt", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sign", "copy"})
_KEPT_WHEN_FALSE = {"LT": lambda k: (k, math.inf), "LE": lambda k: (k + 1, math.inf), "GT": lambda k: (-math.inf, k), "GE": lambda k: (-math.inf, k - 1)}


def guarded_fits_int(ranges: Ranges, conv: Instruction) -> bool:
    """A float -> int ``conv`` whose out-of-range values are provably discarded: every use of it
    flows, element for element (the ops of _ELEMENTWISE, same dims), into the on-false operand
    of one select(compare(R, K), a, .) (K a literal scalar or its broadcast, R an int tensor of
    the select's dims, direction LT/LE/GT/GE; on-true with the compare negated alike), and on the
    elements that select keeps, i.e. with R restricted to where the compare is false, the
    convert's operand is in range (the range analysis seeded with that restriction). Sound
    because the operand depends on R only through elementwise ops of the same dims, so element
    e of it is computed from R[e] alone; whatever the convert gives elsewhere is dropped by the
    select. (T5's relative-position buckets: log(0) = -inf on the small positions, which
    `where(is_small, rel, large)` replaces by rel.)"""
    entry = ranges.module.entry
    dims = tuple(conv.shape.dims)
    users: dict[str, list[Instruction]] = {}
    for ins in entry.instructions:
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    guard: tuple[Instruction, int] | None = None
    todo, seen = [conv], {conv.name}
    while todo:
        cur = todo.pop()
        outs = users.get(cur.name, [])
        if not outs:
            return False  # an output, or unused: the value would be observable
        for u in outs:
            if u.opcode == "select" and len(u.operands) == 3 and u.operands[0] != cur.name and tuple(u.shape.dims) == dims:
                branch = 2 if u.operands[2] == cur.name and u.operands[1] != cur.name else 1 if u.operands[1] == cur.name and u.operands[2] != cur.name else 0
                if not branch or (guard is not None and (guard[0].name != u.name or guard[1] != branch)):
                    return False  # the value selected by its own predicate, or several guards
                guard = (u, branch)
                continue
            if u.opcode not in _ELEMENTWISE or tuple(u.shape.dims) != dims:
                return False
            if u.name not in seen:
                seen.add(u.name)
                todo.append(u)
    if guard is None:
        return False
    sel, branch = guard
    pred = entry.get(sel.operands[0])
    if pred is None or pred.opcode != "compare" or len(pred.operands) != 2 or "type" in pred.attrs:
        return False
    direction = pred.parsed.get("direction", pred.attrs.get("direction"))
    r, kb = entry.get(pred.operands[0]), entry.get(pred.operands[1])
    if r is None or kb is None or r.shape.dtype not in INT_BITS or tuple(r.shape.dims) != dims or direction not in _KEPT_WHEN_FALSE:
        return False
    k = _scalar_literal(entry, kb)
    if k is None:
        return False
    if branch == 1:  # kept where the compare is true: the negated compare is false there
        direction = {"LT": "GE", "LE": "GT", "GT": "LE", "GE": "LT"}[direction]
    lo, hi = _KEPT_WHEN_FALSE[direction](k)
    src = entry.get(conv.operands[0])
    if src is None or not _elementwise_in(entry, src, r, dims):
        return False
    rlo, rhi = ranges.of(r)
    restricted = Ranges(ranges.module, {**ranges.seeds, r.name: (max(rlo, lo), min(rhi, hi))})
    return fits_int(restricted, src, conv.shape.dtype)


def _scalar_literal(entry: object, ins: Instruction) -> int | None:
    """The int value of a scalar int constant or a broadcast of one."""
    if ins.opcode == "broadcast" and len(ins.operands) == 1:
        ins = entry.get(ins.operands[0])  # type: ignore[attr-defined]
        if ins is None:
            return None
    if ins.opcode != "constant" or ins.shape.dims or ins.shape.dtype not in INT_BITS:
        return None
    v = scalar_value(ins.shape.dtype, ins.literal)
    return int(v) if isinstance(v, (int, float)) and float(v).is_integer() else None


def _elementwise_in(entry: object, src: Instruction, r: Instruction, dims: tuple[int, ...]) -> bool:
    """Every instruction between r and src (src's operands, transitively, that depend on r) is
    elementwise with dims ``dims``: src's element e depends on r's element e alone."""
    memo: dict[str, bool] = {}  # name -> depends on r

    def dep(ins: Instruction, depth: int) -> bool | None:  # None: through a non-elementwise op
        if ins.name == r.name:
            return True
        if ins.name in memo:
            return memo[ins.name]
        if depth > MAX_DEPTH:
            return None  # too deep to tell: not proven
        ops = [entry.get(o) for o in ins.operands]  # type: ignore[attr-defined]
        got = [dep(o, depth + 1) if o is not None else False for o in ops]
        if any(x is None for x in got):
            return None
        d = any(got)
        if d and (ins.opcode not in _ELEMENTWISE or tuple(ins.shape.dims) != dims):
            return None
        memo[ins.name] = d
        return d

    return dep(src, 0) is True
