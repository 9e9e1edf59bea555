"""Single-point semantic mutations of a distributed HLO module, through the IR.

A mutant is made by parsing the correct distributed program, changing one instruction (and, when
the change alters a shape, adding the one reshape/transpose/convert that keeps every user
well-typed), and printing the module back with ``engine/hlo/printer.py``. The aim is well-typed
HLO that computes something else: ill-typed text would only test the shape check, not the
rules. Whatever slips through ill-typed is caught downstream (our shape check or XLA) and
counted as malformed, never as a verdict.

Each mutation kind has a cheap ``sites`` predicate (where it may apply) and a mutator that either
edits the module and returns a one-line description, or returns None when the random choice it
drew does not fit (the caller then draws again). Twin mutations (end of the file) edit both
programs at a pair of related instructions.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.printer import print_hlo
from shardproof.engine.ir import Computation, Instruction, Module, Shape

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64")
# Operand order matters for these (swapping equal-shaped operands changes the value).
NONCOMMUTATIVE = ("subtract", "divide", "power", "remainder", "atan2", "compare", "shift-left", "shift-right-arithmetic", "shift-right-logical")
UNARY_SWAPS = {
    "tanh": "logistic", "logistic": "tanh", "exponential": "exponential-minus-one",
    "exponential-minus-one": "exponential", "log": "log-plus-one", "log-plus-one": "log",
    "sqrt": "rsqrt", "rsqrt": "sqrt", "negate": "abs", "abs": "negate", "erf": "tanh",
    "sine": "cosine", "cosine": "sine", "floor": "ceil", "ceil": "floor", "copy": "negate",
    "cbrt": "sqrt",
}  # fmt: skip
BINARY_SWAPS = {
    "add": ("subtract", "multiply", "maximum"), "subtract": ("add", "divide"),
    "multiply": ("divide", "add", "minimum"), "divide": ("multiply", "subtract"),
    "maximum": ("minimum", "add"), "minimum": ("maximum", "multiply"), "power": ("multiply",),
    "and": ("or", "xor"), "or": ("and", "xor"), "xor": ("and", "or"),
}  # fmt: skip
INT_OK = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "and", "or", "xor", "remainder", "negate", "abs"})
PRED_OK = frozenset({"and", "or", "xor", "not"})
DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
ELEMENTWISE = frozenset(UNARY_SWAPS) | frozenset(BINARY_SWAPS) | {"convert", "select", "clamp", "compare"}
REDUCER_OPCODES = {"add": "add", "max": "maximum", "min": "minimum", "mul": "multiply"}


@dataclass(frozen=True)
class Mutant:
    pair: str
    kind: str
    opcode: str  # opcode of the instruction the mutation is about
    instruction: str
    detail: str
    text: str  # the mutated distributed module, printed
    baseline: str | None = None  # the baseline too, for twin mutations (None: unchanged)


@dataclass
class Ctx:
    """One module under mutation plus what mutators need to keep it well-typed."""

    module: Module
    ranks: int  # total ranks (replica count) the pair runs on
    group_size: int
    rng: random.Random
    counter: Iterator[int]

    @property
    def entry(self) -> Computation:
        return self.module.entry

    def fresh(self, base: str) -> str:
        names = {i.name for c in self.module.computations.values() for i in c.instructions}
        names |= set(self.module.computations)
        while True:
            name = f"{base}.mut{next(self.counter)}"
            if name not in names:
                return name

    def shape_of(self, name: str) -> Shape:
        return self.entry[name].shape

    def insert_after(self, anchor: Instruction, new: Instruction) -> None:
        instrs = self.entry.instructions
        instrs.insert(instrs.index(anchor) + 1, new)
        self.entry.reindex()

    def redirect(self, old: Instruction, new: Instruction, *keep: Instruction) -> None:
        """Every use of ``old`` (other than by ``new`` and ``keep``) reads ``new``; the root
        moves along."""
        for ins in self.entry.instructions:
            if ins is not new and all(ins is not k for k in keep):
                ins.operands = [new.name if o == old.name else o for o in ins.operands]
        if old.is_root:
            old.is_root = False
            new.is_root = True

    def derived(self, anchor: Instruction, opcode: str, shape: Shape, operands: list[str], **attrs: str) -> Instruction:
        """A new instruction that carries the anchor's metadata (same layer, same source line),
        so layer partitioning and localization treat it as part of the mutated site."""
        raw = dict(attrs)
        if "metadata" in anchor.attrs:
            raw["metadata"] = anchor.attrs["metadata"]
        return Instruction(self.fresh(anchor.name), opcode, shape, list(operands), attrs=raw)

    def reducer(self, op: str, dtype: str) -> str:
        """Name of a computation ``ROOT op(p0, p1)`` over ``dtype`` scalars; made when missing."""
        opcode = REDUCER_OPCODES[op]
        for comp in self.module.computations.values():
            params = comp.parameters
            root = comp.root
            if (not comp.is_entry and len(params) == 2 and root.opcode == opcode and root.shape == Shape(dtype)
                    and root.operands == [params[0].name, params[1].name] and all(p.shape == Shape(dtype) for p in params)):
                return comp.name
        name = self.fresh(f"{op}_{dtype}")
        a, b = Instruction(f"{name}.a", "parameter", Shape(dtype), [], parameter_number=0), Instruction(f"{name}.b", "parameter", Shape(dtype), [], parameter_number=1)
        root = Instruction(f"{name}.r", opcode, Shape(dtype), [a.name, b.name], is_root=True)
        comps = {name: Computation(name, [a, b, root])}
        comps.update(self.module.computations)
        self.module.computations = comps
        return name


def _shape(dtype: str, dims: tuple[int, ...] | list[int]) -> Shape:
    return Shape(dtype, tuple(dims))


def _ints(raw: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", raw)]


def _braces(xs: list[int] | tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


def _groups_text(groups: list[list[int]]) -> str:
    return "{" + ",".join(_braces(g) for g in groups) + "}"


# -- mutators ---------------------------------------------------------------------------------
# Each takes (ctx, instruction) and returns a description, or None when it does not apply.


def drop_collective(ctx: Ctx, ins: Instruction) -> str | None:
    """The rank skips the collective and uses its own value (the classic missing all-reduce)."""
    meta = {"metadata": ins.attrs["metadata"]} if "metadata" in ins.attrs else {}
    src = ctx.shape_of(ins.operands[0]) if ins.operands else None
    if ins.shape.is_tuple:
        if len(ins.operands) != len(ins.shape.tuple_shapes):
            return None
        ins.opcode, ins.attrs = "tuple", meta
        return "tuple collective replaced by a tuple of its operands"
    if src is None or src.is_tuple:
        return None
    if src.dims == ins.shape.dims:
        ins.opcode, ins.attrs = "copy", meta
        return "replaced by a copy of its operand"
    dims = ins.parsed.get("dimensions") or []
    if ins.opcode == "all-gather" and len(dims) == 1 and src.dims[dims[0]]:
        d = dims[0]
        times = ins.shape.dims[d] // src.dims[d]
        ins.opcode, ins.operands, ins.attrs = "concatenate", [ins.operands[0]] * times, {"dimensions": _braces([d]), **meta}
        return f"all-gather replaced by {times} copies of the local shard"
    if ins.opcode == "reduce-scatter" and len(dims) == 1:
        d = dims[0]
        size = ins.shape.dims[d]
        ranges = [f"[0:{size}]" if i == d else f"[0:{n}]" for i, n in enumerate(src.dims)]
        ins.opcode, ins.attrs = "slice", {"slice": "{" + ", ".join(ranges) + "}", **meta}
        return "reduce-scatter replaced by the first block of the local (unreduced) value"
    return None


def duplicate_collective(ctx: Ctx, ins: Instruction) -> str | None:
    """The collective runs twice (redundant all-reduce), or a gathered/scattered value is summed
    once more over the same group."""
    if ins.shape.is_tuple:
        return None
    src = ctx.shape_of(ins.operands[0])
    if src.dims == ins.shape.dims and ins.opcode != "reduce-scatter":
        dup = replace(ins, name=ctx.fresh(ins.name), operands=[ins.name], is_root=False, attrs=dict(ins.attrs), parsed=dict(ins.parsed), loc=None)
        ctx.insert_after(ins, dup)
        ctx.redirect(ins, dup)
        return f"{ins.opcode} applied twice"
    if "replica_groups" not in ins.attrs:
        return None
    extra = ctx.derived(ins, "all-reduce", ins.shape, [ins.name], replica_groups=ins.attrs["replica_groups"], to_apply="%" + ctx.reducer("add", ins.shape.dtype))
    ctx.insert_after(ins, extra)
    ctx.redirect(ins, extra)
    return f"{ins.opcode} followed by a redundant all-reduce(add)"


def move_collective(ctx: Ctx, ins: Instruction) -> str | None:
    """The all-reduce moves past one elementwise user: f(all-reduce(x)) becomes
    all-reduce(f(x)), which is only right for f linear in x (and wrong for a bias add)."""
    if ins.shape.is_tuple:
        return None
    users = [u for u in ctx.entry.instructions if ins.name in u.operands and u.opcode in ELEMENTWISE and not u.shape.is_tuple and u.shape.dtype == ins.shape.dtype and u.shape.dims == ins.shape.dims]
    if not users:
        return None
    user = ctx.rng.choice(users)
    x = ins.operands[0]
    user.operands = [x if o == ins.name else o for o in user.operands]
    moved = replace(ins, name=ctx.fresh(ins.name), operands=[user.name], is_root=False, attrs=dict(ins.attrs), parsed=dict(ins.parsed), loc=None)
    ctx.insert_after(user, moved)
    ctx.redirect(user, moved)
    return f"all-reduce moved after its user %{user.name} ({user.opcode})"


def collective_dim(ctx: Ctx, ins: Instruction) -> str | None:
    """Gather (scatter) along another axis and reshape to the old shape: the pieces interleave
    wrongly (the sequence-parallel axis-split bug)."""
    dims = list(ins.parsed.get("dimensions", []))
    src = ctx.shape_of(ins.operands[0]).dims
    if len(dims) != 1 or ins.shape.is_tuple or not src:
        return None
    d = dims[0]
    c = ins.shape.dims[d] // src[d] if ins.opcode == "all-gather" and src[d] else (src[d] // ins.shape.dims[d] if ins.shape.dims[d] else 0)
    if c < 2:
        return None
    options = [e for e in range(len(src)) if e != d and (ins.opcode == "all-gather" or src[e] % c == 0)]
    if not options:
        return None
    e = ctx.rng.choice(options)
    new_dims = list(src)
    new_dims[e] = src[e] * c if ins.opcode == "all-gather" else src[e] // c
    old_shape = ins.shape
    ins.shape = _shape(old_shape.dtype, new_dims)
    ins.attrs["dimensions"] = _braces([e])
    back = ctx.derived(ins, "reshape", replace(old_shape, layout=None), [ins.name])
    ctx.insert_after(ins, back)
    ctx.redirect(ins, back)
    return f"{ins.opcode} along dim {e} instead of {d}, reshaped to {list(old_shape.dims)}"


def _partitions(n: int) -> list[list[list[int]]]:
    """Ways to split ranks 0..n-1 into equal groups, in a few orders (contiguous, strided,
    reversed, shuffled)."""
    out: list[list[list[int]]] = []
    for size in [s for s in range(1, n + 1) if n % s == 0]:
        k = n // size
        out.append([list(range(g * size, (g + 1) * size)) for g in range(k)])  # contiguous
        out.append([list(range(g, n, k)) for g in range(k)])  # strided
        out.append([list(reversed(range(g * size, (g + 1) * size))) for g in range(k)])  # reversed
    return out


def replica_groups(ctx: Ctx, ins: Instruction) -> str | None:
    """Other replica groups (or other permute pairs): the wrong ranks reduce/gather together."""
    rng = ctx.rng
    if ins.opcode == "collective-permute":
        pairs = [tuple(p) for p in ins.parsed.get("source_target_pairs") or []]
        if not pairs:
            return None
        n = ctx.ranks
        choices = [
            [(t, s) for s, t in pairs],  # reversed direction
            [(s, (t + 1) % n) for s, t in pairs],  # shifted targets
            pairs[1:],  # one pair dropped
            [(s, s) for s, _ in pairs],  # everyone keeps its own
        ]
        new = [c for c in choices if c != pairs and len({t for _, t in c}) == len(c)]
        if not new:
            return None
        pick = rng.choice(new)
        ins.attrs["source_target_pairs"] = "{" + ",".join(f"{{{s},{t}}}" for s, t in pick) + "}"
        return f"source_target_pairs {pairs} -> {pick}"
    current = ins.parsed.get("replica_groups")
    if current is None:
        return None
    current = [list(g) for g in current]
    size = len(current[0]) if current else ctx.ranks
    options: list[list[list[int]]] = _partitions(ctx.ranks)
    shuffled = [list(range(ctx.ranks))]
    rng.shuffle(shuffled[0])
    options.append(shuffled)
    options.append([])  # {} = all ranks in one group
    if ins.opcode != "all-reduce":
        # the group size fixes the result shape of these
        options = [o for o in options if (len(o[0]) if o else ctx.ranks) == size]
    options = [o for o in options if o != current]
    if not options:
        return None
    pick = rng.choice(options)
    ins.attrs["replica_groups"] = _groups_text(pick) if pick else "{}"
    return f"replica_groups {_groups_text(current)} -> {_groups_text(pick) if pick else '{}'}"


def slice_offset(ctx: Ctx, ins: Instruction) -> str | None:
    """The slice takes the same size at another offset (wrong fused-block offset)."""
    src = ctx.shape_of(ins.operands[0]).dims
    sl = [list(x) for x in ins.parsed.get("slice", [])]
    dims = [d for d, (a, b, _s) in enumerate(sl) if b - a < src[d]]
    if not dims:
        return None
    d = ctx.rng.choice(dims)
    a, b, s = sl[d]
    size = b - a
    starts = {a + 1, a - 1, a + size, a - size, 0, src[d] - size, ctx.rng.randrange(0, src[d] - size + 1)}
    starts = sorted(x for x in starts if 0 <= x <= src[d] - size and x != a)
    if not starts:
        return None
    new = ctx.rng.choice(starts)
    sl[d] = [new, new + size, s]
    ins.attrs["slice"] = "{" + ", ".join(f"[{x}:{y}]" if st == 1 else f"[{x}:{y}:{st}]" for x, y, st in sl) + "}"
    return f"slice dim {d} [{a}:{b}] -> [{new}:{new + size}]"


_NUMBER = re.compile(r"-?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _new_number(rng: random.Random, text: str, dtype: str) -> str | None:
    if dtype in FLOATS:
        v = float(text)
        if math.isnan(v) or math.isinf(v):
            return rng.choice(["0", "1", "-1"])
        cands = {v + 1, v - 1, v * 2, v / 2, -v, 0.0, 1.0, 0.5, v * 1.5, round(rng.uniform(-4, 4), 3)}
        cands.discard(v)
        limit = {"f16": 65504.0, "bf16": 3.38e38}.get(dtype, 3.4e38 if dtype == "f32" else 1.7e308)
        pick = rng.choice(sorted(x for x in cands if abs(x) <= limit))
        return repr(pick)
    if dtype in INTS:
        v = int(text)
        bits = int(dtype[1:])
        lo, hi = (0, 2**bits - 1) if dtype[0] == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        cands = {v + 1, v - 1, 0, 1, -v, 2 * v, rng.randint(-64, 64)}
        cands.discard(v)
        ok = sorted(x for x in cands if lo <= x <= hi)
        return str(rng.choice(ok)) if ok else None
    return None


def constant(ctx: Ctx, ins: Instruction) -> str | None:
    """Another value for a literal (one element of an array literal)."""
    lit = ins.literal or ""
    dtype = ins.shape.dtype
    if dtype == "pred":
        words = list(re.finditer(r"true|false", lit))
        if not words:
            return None
        m = ctx.rng.choice(words)
        flipped = "false" if m.group(0) == "true" else "true"
        ins.literal = lit[: m.start()] + flipped + lit[m.end() :]
        return f"pred literal {m.group(0)} -> {flipped}"
    nums = list(_NUMBER.finditer(lit))
    if not nums or "..." in lit:
        return None
    m = ctx.rng.choice(nums)
    new = _new_number(ctx.rng, m.group(0), dtype)
    if new is None:
        return None
    ins.literal = lit[: m.start()] + new + lit[m.end() :]
    return f"{dtype} literal {m.group(0)} -> {new}" + (f" (element {nums.index(m)})" if len(nums) > 1 else "")


def transpose_perm(ctx: Ctx, ins: Instruction) -> str | None:
    """Another permutation; a reshape back to the old result shape keeps users well-typed."""
    src = ctx.shape_of(ins.operands[0]).dims
    perm = list(ins.parsed.get("dimensions", []))
    others = [list(p) for p in itertools.permutations(range(len(src))) if list(p) != perm]
    if not others:
        return None
    new = ctx.rng.choice(others)
    out = tuple(src[d] for d in new)
    old_shape = ins.shape
    ins.attrs["dimensions"] = _braces(new)
    if out == old_shape.dims:
        return f"dimensions {perm} -> {new}"
    ins.shape = _shape(old_shape.dtype, out)
    back = ctx.derived(ins, "reshape", replace(old_shape, layout=None), [ins.name])
    ctx.insert_after(ins, back)
    ctx.redirect(ins, back)
    return f"dimensions {perm} -> {new} (then reshaped to {list(old_shape.dims)})"


def reshape_shape(ctx: Ctx, ins: Instruction) -> str | None:
    """Reshape straight to a permuted shape, then transpose into the old one: the BSH bug (the
    element order differs unless only size-1 axes move)."""
    dims = ins.shape.dims
    if len(dims) < 2 or len(set(dims)) < 2:
        return None
    perms = [p for p in itertools.permutations(range(len(dims))) if tuple(dims[i] for i in p) != dims]
    if not perms:
        return None
    pi = list(ctx.rng.choice(perms))
    wrong = tuple(dims[i] for i in pi)
    inverse = [pi.index(j) for j in range(len(dims))]
    old_shape = ins.shape
    ins.shape = _shape(old_shape.dtype, wrong)
    fix = ctx.derived(ins, "transpose", replace(old_shape, layout=None), [ins.name], dimensions=_braces(inverse))
    ctx.insert_after(ins, fix)
    ctx.redirect(ins, fix)
    return f"reshape to {list(wrong)} then transpose {inverse} to {list(dims)}"


def _dot_out(lhs: tuple[int, ...], rhs: tuple[int, ...], lb: list[int], rb: list[int], lc: list[int], rc: list[int]) -> tuple[int, ...]:
    lfree = [lhs[d] for d in range(len(lhs)) if d not in lb and d not in lc]
    rfree = [rhs[d] for d in range(len(rhs)) if d not in rb and d not in rc]
    return (*(lhs[d] for d in lb), *lfree, *rfree)


def dot_dims(ctx: Ctx, ins: Instruction) -> str | None:
    """Contract (or batch) over another axis of the same size: the weight used transposed."""
    lhs, rhs = (ctx.shape_of(o).dims for o in ins.operands)
    keys = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")
    lb, rb, lc, rc = (list(ins.parsed.get(k, [])) for k in keys)
    options = []
    for side, dims_of, lists in (("lhs", lhs, (lb, lc)), ("rhs", rhs, (rb, rc))):
        for which, lst in zip(("batch", "contracting"), lists, strict=True):
            for i, d in enumerate(lst):
                used = set(lists[0]) | set(lists[1])
                for f in range(len(dims_of)):
                    if f not in used and dims_of[f] == dims_of[d]:
                        options.append((side, which, i, f))
    ctx.rng.shuffle(options)
    for side, which, i, f in options:
        nlb, nrb, nlc, nrc = list(lb), list(rb), list(lc), list(rc)
        target = {("lhs", "batch"): nlb, ("rhs", "batch"): nrb, ("lhs", "contracting"): nlc, ("rhs", "contracting"): nrc}[(side, which)]
        old = target[i]
        target[i] = f
        if _dot_out(lhs, rhs, nlb, nrb, nlc, nrc) != ins.shape.dims:
            continue
        for k, v in zip(keys, (nlb, nrb, nlc, nrc), strict=True):
            if v:
                ins.attrs[k] = _braces(v)
        return f"{side}_{which}_dims: {old} -> {f}"
    return None


def swap_operands(ctx: Ctx, ins: Instruction) -> str | None:
    """Swap two operands where order matters (a - b, select branches, concatenation order)."""
    ops = ins.operands
    if ins.opcode == "select" and len(ops) == 3:
        if ops[1] == ops[2]:
            return None
        ins.operands = [ops[0], ops[2], ops[1]]
        return "select branches swapped"
    if ins.opcode == "clamp" and len(ops) == 3:
        if ops[0] == ops[2] or ctx.shape_of(ops[0]) != ctx.shape_of(ops[2]):
            return None
        ins.operands = [ops[2], ops[1], ops[0]]
        return "clamp bounds swapped"
    if ins.opcode == "concatenate":
        pairs = [(i, j) for i in range(len(ops)) for j in range(i + 1, len(ops)) if ops[i] != ops[j] and ctx.shape_of(ops[i]) == ctx.shape_of(ops[j])]
        if not pairs:
            return None
        i, j = ctx.rng.choice(pairs)
        new = list(ops)
        new[i], new[j] = new[j], new[i]
        ins.operands = new
        return f"concatenate operands {i} and {j} swapped"
    if len(ops) == 2 and ops[0] != ops[1] and ctx.shape_of(ops[0]) == ctx.shape_of(ops[1]):
        ins.operands = [ops[1], ops[0]]
        return f"{ins.opcode} operands swapped" + (f" (direction={ins.attrs.get('direction')})" if ins.opcode == "compare" else "")
    return None


def dtype(ctx: Ctx, ins: Instruction) -> str | None:
    """Round-trip the value through another element type (inconsistent precision); a few
    round-trips widen and are exact."""
    t = ins.shape.dtype
    if t == "f32":
        low = ctx.rng.choice(["bf16", "f16", "bf16", "f16", "f64"])
    elif t in ("bf16", "f16"):
        low = ctx.rng.choice(["f8e5m2", "s32", "f32"])
    elif t == "f64":
        low = ctx.rng.choice(["f32", "bf16"])
    elif t in ("s32", "s64"):
        low = ctx.rng.choice(["s8", "s16", "f16"])
    else:
        return None
    to = ctx.derived(ins, "convert", _shape(low, ins.shape.dims), [ins.name])
    back = ctx.derived(ins, "convert", _shape(t, ins.shape.dims), [to.name])
    ctx.insert_after(ins, to)
    ctx.insert_after(to, back)
    ctx.redirect(ins, back, to)
    return f"{t} -> {low} -> {t}"


INSERTED = ("negate", "abs", "tanh", "exponential", "logistic", "floor", "sign", "cosine", "sqrt")


def insert_op(ctx: Ctx, ins: Instruction) -> str | None:
    """An extra elementwise op on a value (a stray activation, a sign flip)."""
    op = ctx.rng.choice(INSERTED)
    new = ctx.derived(ins, op, replace(ins.shape, layout=None), [ins.name])
    ctx.insert_after(ins, new)
    ctx.redirect(ins, new)
    return f"{op} inserted after it"


def opcode(ctx: Ctx, ins: Instruction) -> str | None:
    """Another elementwise op of the same arity and types (tanh for erf, max for min, <= for <)."""
    op, t = ins.opcode, ins.shape.dtype
    if op == "compare":
        d = ins.attrs.get("direction", "")
        new = ctx.rng.choice([x for x in DIRECTIONS if x != d])
        ins.attrs["direction"] = new
        return f"compare direction {d} -> {new}"
    if op in UNARY_SWAPS and t in FLOATS:
        ins.opcode = UNARY_SWAPS[op]
        return f"{op} -> {ins.opcode}"
    if op in BINARY_SWAPS:
        allowed = [x for x in BINARY_SWAPS[op] if (t in FLOATS and x not in PRED_OK) or (t in INTS and x in INT_OK) or (t == "pred" and x in PRED_OK)]
        if not allowed:
            return None
        ins.opcode = ctx.rng.choice(allowed)
        return f"{op} -> {ins.opcode}"
    return None


def reducer(ctx: Ctx, ins: Instruction) -> str | None:
    """Reduce with another combiner (sum for max, ...)."""
    callee = ins.parsed.get("to_apply")
    if not isinstance(callee, str) or callee not in ctx.module.computations:
        return None
    root = ctx.module.computations[callee].root
    t = root.shape.dtype
    current = {v: k for k, v in REDUCER_OPCODES.items()}.get(root.opcode)
    if root.shape.is_tuple or t not in FLOATS + INTS:
        return None
    new = ctx.rng.choice([op for op in REDUCER_OPCODES if op != current])
    ins.attrs["to_apply"] = "%" + ctx.reducer(new, t)
    return f"reducer {current or root.opcode} -> {new}"


def rewire(ctx: Ctx, ins: Instruction) -> str | None:
    """One operand reads another value of the same type defined earlier."""
    before = ctx.entry.instructions[: ctx.entry.instructions.index(ins)]
    slots = list(range(len(ins.operands)))
    ctx.rng.shuffle(slots)
    for i in slots:
        cur = ins.operands[i]
        shape = ctx.shape_of(cur)
        cands = [x.name for x in before if x.name != cur and x.shape.dtype == shape.dtype and x.shape.dims == shape.dims and not x.shape.is_tuple]
        if cands:
            pick = ctx.rng.choice(cands)
            ins.operands = [*ins.operands[:i], pick, *ins.operands[i + 1 :]]
            return f"operand {i} %{cur} -> %{pick}"
    return None


def broadcast_dims(ctx: Ctx, ins: Instruction) -> str | None:
    """The operand's axes land on other result axes of the same sizes."""
    src = ctx.shape_of(ins.operands[0]).dims
    dims = list(ins.parsed.get("dimensions", []))
    out = ins.shape.dims
    options = [list(c) for c in itertools.combinations(range(len(out)), len(src)) if list(c) != dims and all(out[e] == s for e, s in zip(c, src, strict=True))]
    if not options:
        return None
    new = ctx.rng.choice(options)
    ins.attrs["dimensions"] = _braces(new)
    return f"broadcast dimensions {dims} -> {new}"


# -- where each kind applies --------------------------------------------------------------------


def _is_array(ins: Instruction) -> bool:
    return not ins.shape.is_tuple and ins.shape.dtype not in ("token", "opaque")


Site = Callable[[Instruction], bool]

KINDS: dict[str, tuple[Site, Callable[[Ctx, Instruction], str | None]]] = {
    "drop-collective": (lambda i: i.opcode in COLLECTIVES, drop_collective),
    "duplicate-collective": (lambda i: i.opcode in COLLECTIVES and _is_array(i), duplicate_collective),
    "replica-groups": (lambda i: i.opcode in COLLECTIVES, replica_groups),
    "move-collective": (lambda i: i.opcode == "all-reduce", move_collective),
    "collective-dim": (lambda i: i.opcode in ("all-gather", "reduce-scatter"), collective_dim),
    "slice-offset": (lambda i: i.opcode == "slice", slice_offset),
    "constant": (lambda i: i.opcode == "constant" and _is_array(i), constant),
    "transpose-perm": (lambda i: i.opcode == "transpose" and i.shape.rank >= 2, transpose_perm),
    "reshape-shape": (lambda i: i.opcode == "reshape" and i.shape.rank >= 2 and len(set(i.shape.dims)) > 1, reshape_shape),
    "dot-dims": (lambda i: i.opcode == "dot", dot_dims),
    "swap-operands": (lambda i: i.opcode in (*NONCOMMUTATIVE, "select", "clamp", "concatenate"), swap_operands),
    "dtype": (lambda i: _is_array(i) and i.opcode not in ("parameter",) and i.shape.dtype in ("f32", "bf16", "f16", "f64", "s32", "s64"), dtype),
    "insert-op": (lambda i: _is_array(i) and i.opcode != "parameter" and i.shape.dtype in FLOATS, insert_op),
    "opcode": (lambda i: _is_array(i) and (i.opcode == "compare" or i.opcode in UNARY_SWAPS or i.opcode in BINARY_SWAPS), opcode),
    "reducer": (lambda i: i.opcode in ("reduce", "all-reduce", "reduce-scatter") and _is_array(i), reducer),
    "rewire": (lambda i: bool(i.operands) and i.opcode not in ("get-tuple-element", "tuple"), rewire),
    "broadcast-dims": (lambda i: i.opcode == "broadcast" and bool(i.parsed.get("dimensions")), broadcast_dims),
}


def sites(module: Module) -> dict[str, list[str]]:
    """Instruction names of the entry computation each kind may mutate."""
    out: dict[str, list[str]] = {}
    for kind, (applies, _) in KINDS.items():
        names = [i.name for i in module.entry.instructions if applies(i)]
        if names:
            out[kind] = names
    return out


def _clone(module: Module) -> Module:
    """A copy whose instructions can be edited (mutators reassign fields and edit ``attrs``,
    ``operands`` and instruction lists in place); much cheaper than parsing again."""
    comps = {}
    for name, comp in module.computations.items():
        instrs = [replace(i, operands=list(i.operands), attrs=dict(i.attrs), parsed=dict(i.parsed)) for i in comp.instructions]
        comps[name] = Computation(comp.name, instrs, comp.is_entry, comp.loc)
    return replace(module, computations=comps, header=dict(module.header))


@functools.lru_cache(maxsize=64)
def _parsed(pair: str, text: str) -> tuple[Module, dict[str, list[str]]]:
    base = parse_hlo(text, pair)
    return base, sites(base)


def mutate(pair: str, text: str, ranks: int, group_size: int, rng: random.Random, kinds: list[str] | None = None, tries: int = 40) -> Mutant | None:
    """One random single-point mutant of ``text`` (a distributed module), or None when no
    kind applies."""
    base, where = _parsed(pair, text)
    choices = [k for k in (kinds or list(KINDS)) if k in where]
    for _ in range(tries):
        if not choices:
            return None
        kind = rng.choice(choices)
        name = rng.choice(where[kind])
        module = _clone(base)
        ctx = Ctx(module, ranks, group_size, rng, itertools.count())
        ins = module.entry[name]
        op = ins.opcode
        detail = KINDS[kind][1](ctx, ins)
        if detail is None:
            continue
        # The entry layout would repeat (and contradict) result shapes a mutation changed.
        module.header = {k: v for k, v in module.header.items() if k != "entry_computation_layout"}
        return Mutant(pair, kind, op, name, detail, print_hlo(module))
    return None


# -- twin mutations: the same edit on both sides ------------------------------------------------
# A single-point mutant asks "does the verifier notice a change?". A twin mutant applies one
# edit to a distributed value *and* to the baseline value it is related to (dup, sharded,
# partial, per the verifier's own trace of the correct pair), so it asks the sharper question
# "is the relation really preserved by this op?" -- exactly the claim each propagation rule makes.

TWIN_UNARY_FLOAT = ("negate", "abs", "exponential", "log", "sqrt", "rsqrt", "tanh", "logistic", "floor", "ceil", "sign", "cosine", "cbrt", "exponential-minus-one", "log-plus-one", "round-nearest-even")
TWIN_UNARY_INT = ("negate", "abs", "not", "popcnt")
TWIN_ROUND_TRIPS = {"f32": ("pred", "s8", "u8", "s32", "u32", "f16", "bf16", "f64"), "s32": ("pred", "s8", "u8", "u32", "f32", "s64")}
TWIN_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder")
TWIN_LITERALS = {"f": ("0", "1", "-1", "2", "0.5", "-inf"), "s": ("0", "1", "-1", "2", "3")}


def _twin_edit(rng: random.Random, dtype: str) -> tuple[str, tuple[str, ...]] | None:
    """One edit as data: ("unary", op) / ("convert", via-type) / ("binary", op, literal, side)."""
    if dtype not in ("f32", "s32"):
        return None
    cls = dtype[0]
    r = rng.random()
    if r < 0.4:
        return "unary", (rng.choice(TWIN_UNARY_FLOAT if cls == "f" else TWIN_UNARY_INT),)
    if r < 0.65:
        return "convert", (rng.choice(TWIN_ROUND_TRIPS[dtype]),)
    op = rng.choice([o for o in TWIN_BINARY if cls == "f" or o not in ("power",)])
    return "binary", (op, rng.choice(TWIN_LITERALS[cls]), rng.choice(("left", "right")))


def _apply_twin(ctx: Ctx, ins: Instruction, kind: str, args: tuple[str, ...]) -> None:
    shape = replace(ins.shape, layout=None)
    if kind == "unary":
        new = ctx.derived(ins, args[0], shape, [ins.name])
        ctx.insert_after(ins, new)
        ctx.redirect(ins, new)
    elif kind == "convert":
        to = ctx.derived(ins, "convert", replace(shape, dtype=args[0]), [ins.name])
        back = ctx.derived(ins, "convert", shape, [to.name])
        ctx.insert_after(ins, to)
        ctx.insert_after(to, back)
        ctx.redirect(ins, back, to)
    else:
        op, literal, side = args
        c = ctx.derived(ins, "constant", Shape(ins.shape.dtype), [])
        c.literal = literal
        b = ctx.derived(ins, "broadcast", shape, [c.name], dimensions="{}")
        new = ctx.derived(ins, op, shape, [ins.name, b.name] if side == "right" else [b.name, ins.name])
        ctx.insert_after(ins, c)
        ctx.insert_after(c, b)
        ctx.insert_after(b, new)
        ctx.redirect(ins, new)


def twin_mutate(pair: str, baseline: str, text: str, steps: list[tuple[str, str, str]], ranks: int, group_size: int, rng: random.Random) -> Mutant | None:
    """The same edit after a related (distributed, baseline) instruction pair of the trace."""
    if not steps:
        return None
    d_name, b_name, relation = rng.choice(steps)
    base, _ = _parsed(pair + "/baseline", baseline)
    dist, _ = _parsed(pair, text)
    bm, dm = _clone(base), _clone(dist)
    bi, di = bm.entry.get(b_name), dm.entry.get(d_name)
    if bi is None or di is None or bi.shape.is_tuple or di.shape.is_tuple or bi.shape.dtype != di.shape.dtype:
        return None
    edit = _twin_edit(rng, di.shape.dtype)
    if edit is None:
        return None
    _apply_twin(Ctx(bm, ranks, group_size, rng, itertools.count()), bi, *edit)
    _apply_twin(Ctx(dm, ranks, group_size, rng, itertools.count()), di, *edit)
    for m in (bm, dm):
        m.header = {k: v for k, v in m.header.items() if k != "entry_computation_layout"}
    what = {"unary": lambda a: a[0], "convert": lambda a: f"convert via {a[0]}", "binary": lambda a: f"{a[0]}({'x, ' + a[1] if a[2] == 'right' else a[1] + ', x'})"}[edit[0]](edit[1])
    return Mutant(pair, "twin-op", di.opcode, d_name, f"{what} after %{d_name} and baseline %{b_name} ({relation})", print_hlo(dm), print_hlo(bm))
