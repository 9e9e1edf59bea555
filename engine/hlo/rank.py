"""The device id as the rank: exact evaluation of the integer arithmetic a program does on it.

A per-device program from XLA's SPMD partitioner or from ``shard_map`` does not read "the rank"
from a parameter; it computes it from ``partition-id()`` (or ``replica-id()``), the device's
global id (hlo.flavours turns that instruction into a parameter marked ``device_id``):

- JAX writes ``axis_index('x')`` as ``convert(remainder(divide(pid, stride), size))`` (u32 ->
  s32), which XLA's optimizer may rewrite to ``and(pid, size - 1)``;
- the partitioner indexes offset tables by it: ``dynamic-slice(constant({0,2,4,6}), pid)``.

Both are functions of the device id d. With the relations file's groups, device d is rank r of
group k when ``groups[k][r] == d``. For each scalar integer value v that is computed from the
device id only (through the ops ``ScalarEval`` knows), this module evaluates v exactly, with the
machine's semantics (wrapping converts and arithmetic, truncating division, clamped
dynamic-slice starts), on *every* device of *every* group. When v takes the same value on rank r
of every group and that value is ``a·r + b`` for all r in [0, c), v is replaced by the same value
spelled in the rank arithmetic the rules know (rules/slicing.egg: ``affine``): a rank parameter
of v's type, times a, plus b. Nothing is assumed: the replacement is checked on all N devices.
Values that depend on the group (the data-parallel index in a DP x TP mesh) or are not affine in
the rank stay functions of the device-id parameter, which relates to nothing.

Side conditions (audit, issue 23): every integer type (narrow and unsigned included) is
evaluated with its wrap, and a value is accepted only as the exact integer a·r + b it equals on
every device; the spelling that replaces it computes that integer in the value's own type, so
any wrap in its steps cancels (the value itself fits the type). Constant tables are read only
when every literal fits its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..ir import Instruction, Module, Shape
from .literals import INT_BITS

Value = int | tuple[int, ...]
RANK_TYPES = ("s32", "u32", "s64", "u64")
MAX_TABLE = 1 << 16  # constant tables the evaluator reads (partitioner offset tables are per device)


def wrap(v: int, dtype: str) -> int:
    """v reduced to the int type's range, two's complement (XLA's integer semantics)."""
    if dtype == "pred":
        return 1 if v else 0
    bits = INT_BITS[dtype]
    v &= (1 << bits) - 1
    if dtype[0] == "s" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _literal(ins: Instruction) -> Value | None:
    text = (ins.literal or "").strip()
    dt = ins.shape.dtype
    if dt not in INT_BITS and dt != "pred":
        return None
    body = text.replace("{", " ").replace("}", " ").replace(",", " ").split()
    if ins.shape.numel > MAX_TABLE or len(body) != ins.shape.numel:
        return None
    vals: list[int] = []
    for t in body:
        if t in ("true", "false"):
            vals.append(1 if t == "true" else 0)
            continue
        try:
            vals.append(int(t, 0))
        except ValueError:
            return None
        if wrap(vals[-1], dt) != vals[-1]:
            return None
    return vals[0] if ins.shape.dims == () else tuple(vals)


def _cmp(direction: str, a: int, b: int) -> int | None:
    return {"EQ": a == b, "NE": a != b, "LT": a < b, "LE": a <= b, "GT": a > b, "GE": a >= b}.get(direction)  # type: ignore[return-value]


class ScalarEval:
    """Exact values of scalar (and one-element / 1-D constant) integer and pred instructions.

    ``lookup`` finds an instruction by name; ``env`` gives values of parameters (by name).
    ``value`` returns None for anything it does not compute exactly (floats, unknown opcodes,
    division by zero, non-constant tables)."""

    def __init__(self, lookup: Callable[[str], Instruction | None], env: dict[str, int] | None = None) -> None:
        self.lookup = lookup
        self.env = env or {}
        self.memo: dict[str, Value | None] = {}

    def value(self, name: str) -> Value | None:
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = None  # a cycle (never in HLO) reads as unknown
        ins = self.lookup(name)
        try:
            v = self._eval(ins) if ins is not None else None
        except RecursionError:  # a chain deeper than Python's stack: unknown, never a crash
            v = None
        self.memo[name] = v
        return v

    def _scalar(self, name: str) -> int | None:
        v = self.value(name)
        if isinstance(v, tuple):
            return v[0] if len(v) == 1 else None
        return v

    def _eval(self, ins: Instruction) -> Value | None:
        op, dt, shape = ins.opcode, ins.shape.dtype, ins.shape
        if op == "parameter":
            v = self.env.get(ins.name)
            return None if v is None else wrap(v, dt) if dt in INT_BITS or dt == "pred" else None
        if op == "constant":
            return _literal(ins)
        if op == "tuple" or shape.is_tuple:
            return None
        if op == "get-tuple-element" and ins.operands and ins.tuple_index is not None:
            src = self.lookup(ins.operands[0])
            if src is not None and src.opcode == "tuple" and ins.tuple_index < len(src.operands):
                return self.value(src.operands[ins.tuple_index])
            return None
        if dt not in INT_BITS and dt != "pred":
            return None
        if shape.numel != 1:
            return None
        ops = [self._scalar(o) for o in ins.operands]
        if op in ("copy", "reshape", "bitcast", "broadcast") and len(ops) == 1:
            src = self.lookup(ins.operands[0])
            if src is None or src.shape.dtype != dt or ops[0] is None:
                return None
            return ops[0]
        if op == "dynamic-slice" and len(ins.operands) == 2:
            table = self.value(ins.operands[0])
            src = self.lookup(ins.operands[0])
            idx = ops[1]
            if not isinstance(table, tuple) or idx is None or src is None or src.shape.rank != 1:
                return None
            # XLA clamps a start index so the slice stays inside the operand.
            return table[min(max(idx, 0), len(table) - 1)]
        if any(v is None for v in ops):
            return None
        vals: list[int] = [v for v in ops if v is not None]
        if op == "convert" and len(vals) == 1:
            src = self.lookup(ins.operands[0])
            if src is None or (src.shape.dtype not in INT_BITS and src.shape.dtype != "pred"):
                return None
            return wrap(vals[0], dt)
        if op == "select" and len(vals) == 3:
            return vals[1] if vals[0] else vals[2]
        if op == "clamp" and len(vals) == 3:
            return min(max(vals[1], vals[0]), vals[2])
        if op == "not" and len(vals) == 1:
            return wrap(~vals[0], dt) if dt != "pred" else int(not vals[0])
        if op == "negate" and len(vals) == 1:
            return wrap(-vals[0], dt)
        if len(vals) != 2:
            return None
        a, b = vals
        if op == "compare":
            d = ins.parsed.get("direction")
            r = _cmp(d, a, b) if isinstance(d, str) else None
            return None if r is None else int(r)
        bits = INT_BITS.get(dt, 1)
        if op == "add":
            return wrap(a + b, dt)
        if op == "subtract":
            return wrap(a - b, dt)
        if op == "multiply":
            return wrap(a * b, dt)
        if op in ("divide", "remainder"):
            if b == 0:
                return None  # XLA defines x/0 and x%0, but no rank arithmetic needs them
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # truncates toward zero
            return wrap(q, dt) if op == "divide" else wrap(a - q * b, dt)
        if op == "and":
            return wrap(a & b, dt)
        if op == "or":
            return wrap(a | b, dt)
        if op == "xor":
            return wrap(a ^ b, dt)
        if op == "maximum":
            return max(a, b)
        if op == "minimum":
            return min(a, b)
        if op in ("shift-left", "shift-right-logical", "shift-right-arithmetic") and dt != "pred":
            if b < 0 or b >= bits:  # XLA: out-of-range shifts give 0 (or the sign for arithmetic)
                return wrap(-1 if (op == "shift-right-arithmetic" and a < 0) else 0, dt)
            if op == "shift-left":
                return wrap(a << b, dt)
            if op == "shift-right-arithmetic":
                return wrap(a >> b, dt)
            return wrap((a & ((1 << bits) - 1)) >> b, dt)
        return None


def _affine(seq: list[int]) -> tuple[int, int] | None:
    if not seq:
        return None
    b = seq[0]
    a = seq[1] - seq[0] if len(seq) > 1 else 0
    return (a, b) if all(v == a * r + b for r, v in enumerate(seq)) else None


def _rotated(seq: list[int]) -> tuple[int, int] | None:
    """(w, k) when seq[r] == w·((r + k) mod c) for every r, w >= 1 and 0 < k < c: the start of
    block (r + k) mod c of blocks of w (a ring step's chunk offset), which is not affine in r."""
    c = len(seq)
    zeros = [r for r, v in enumerate(seq) if v == 0]
    if c < 2 or len(zeros) != 1 or zeros[0] == 0:
        return None
    k = c - zeros[0]
    w = seq[(zeros[0] + 1) % c]
    if w < 1 or any(v != w * ((r + k) % c) for r, v in enumerate(seq)):
        return None
    return w, k


def bind_device_ids(module: Module, groups: list[list[int]]) -> set[str]:
    """Rewrite the entry computation in place (it is normalize()'s private copy): every scalar
    integer value computed from the device-id parameters alone that equals ``a·r + b`` on rank r
    of every group becomes that expression over a rank parameter. Returns the names of the rank
    parameters it added."""
    comp = module.entry
    dev = [i for i in comp.instructions if i.opcode == "parameter" and i.parsed.get("device_id")]
    if not dev:
        return set()
    by = {i.name: i for i in comp.instructions}
    dev_names = {d.name for d in dev}
    # Values that depend on a device id (forward closure).
    derived: set[str] = set(dev_names)
    for ins in comp.instructions:
        if ins.opcode != "parameter" and any(o in derived for o in ins.operands):
            derived.add(ins.name)
    c = len(groups[0])
    devices = [(k, r, d) for k, g in enumerate(groups) for r, d in enumerate(g)]
    evals = [ScalarEval(by.get, {n: d for n in dev_names}) for _, _, d in devices]
    computable: dict[str, list[int]] = {}
    for ins in comp.instructions:
        if ins.name not in derived or ins.opcode == "parameter" or ins.shape.dims != () or ins.shape.dtype not in INT_BITS:
            continue
        vals = [e.value(ins.name) for e in evals]
        if all(isinstance(v, int) for v in vals):
            computable[ins.name] = vals  # type: ignore[assignment]
    users: dict[str, list[Instruction]] = {}
    for ins in comp.instructions:
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    replace_with: dict[str, tuple[int, int]] = {}
    rotated: dict[str, tuple[int, int]] = {}
    for name, vals in computable.items():
        # Only the outermost computable values: an inner one feeds only computable ones.
        if by[name].is_root or any(u.name not in computable for u in users.get(name, [])):
            per_rank: list[int | None] = [None] * c
            consistent = True
            for (_, r, _), v in zip(devices, vals, strict=True):
                if per_rank[r] is None:
                    per_rank[r] = v
                elif per_rank[r] != v:
                    consistent = False  # differs between groups: not a function of the rank
                    break
            ab = _affine([v for v in per_rank if v is not None]) if consistent and None not in per_rank else None
            if ab is not None:
                replace_with[name] = ab
            elif consistent and None not in per_rank:
                wk = _rotated([v for v in per_rank if v is not None])
                if wk is not None:
                    rotated[name] = wk
                    replace_with[name] = (1, 0)  # spelled from the rank below, as (r + k) rem c times w
    if not replace_with:
        return set()
    next_param = 1 + max((i.parameter_number or 0) for i in comp.instructions if i.opcode == "parameter")
    rank_params: dict[str, Instruction] = {}
    alias: dict[str, str] = {}
    out: list[Instruction] = []
    for ins in comp.instructions:
        if alias:
            ins.operands = [alias.get(o, o) for o in ins.operands]
        if ins.name not in replace_with:
            out.append(ins)
            continue
        a, b = replace_with[ins.name]
        dt = ins.shape.dtype
        scalar = Shape(dt)
        if a == 0:  # the same value on every device: a literal
            out.append(replace(ins, opcode="constant", operands=[], attrs={}, parsed={}, literal=str(b)))
            continue
        rdt = dt if dt in RANK_TYPES else "s32"
        if rdt not in rank_params:
            pname = f"rank.{rdt}"
            while pname in by:
                pname += "_"
            p = Instruction(pname, "parameter", Shape(rdt), [], parsed={"rank_from_device_id": True}, parameter_number=next_param, loc=ins.loc)
            next_param += 1
            rank_params[rdt] = p
            out.append(p)
        x = rank_params[rdt].name
        steps: list[tuple[str, str, int]] = []
        if rdt != dt:
            steps.append(("convert", "", 0))
        if ins.name in rotated:
            # r + k lies in [k, c + k), non-negative: the machine's truncating remainder by c is
            # the mod; every intermediate is at most 2c - 2 or the value itself (it fits dt).
            w, k = rotated[ins.name]
            steps += [("add", "b", k), ("remainder", "c", c)] + ([("multiply", "a", w)] if w != 1 else [])
        elif abs(a) != 1:
            steps.append(("multiply", "a", abs(a)))
        if ins.name not in rotated and (b != 0 or a < 0):
            steps.append(("subtract" if a < 0 else "add", "b", b))
        if not steps and not ins.is_root:
            alias[ins.name] = x  # the value is the rank itself: its users read the rank parameter
            continue
        if not steps:
            steps.append(("copy", "", 0))
        for j, (op, what, k) in enumerate(steps):
            last = j == len(steps) - 1
            name = ins.name if last else f"{ins.name}.{op}"
            if op in ("convert", "copy"):
                operands = [x]
            else:
                lit = Instruction(f"{ins.name}.{what}", "constant", scalar, [], literal=str(k), metadata=ins.metadata, loc=ins.loc, origin=ins.origin or ins.name)
                out.append(lit)
                # b - |a|·r for a < 0; x·|a| and x + b otherwise.
                operands = [lit.name, x] if op == "subtract" else [x, lit.name]
            # The steps keep the original's name as their origin: the source map names them by it.
            out.append(replace(ins, name=name, opcode=op, operands=operands, attrs={}, parsed={}, literal=None, is_root=ins.is_root and last, origin=ins.origin or ins.name))
            x = name
    comp.instructions = out
    comp.reindex()
    return {p.name for p in rank_params.values()}
