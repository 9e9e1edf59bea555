"""Rank-dependent integer and boolean tensors, evaluated exactly on every rank (rules/rankint.egg).

Law: a distributed tensor x' computed from the rank (a rank parameter, or the device id) and
literals only (iotas, constants) has one exact value x'_r on rank r; a baseline tensor x
computed from literals only has one exact value. Then

- ``rkdup(x, x')``        x'_r == x on every rank r: every rank holds exactly x (``dup``);
- ``rkshard(x, x', d)``   x'_r == block r of c equal blocks of x along dim d (``sharded``,
                          contiguous split);

hold for every input of either program, since neither reads an input. A rank *scalar* computed
with ops the rank arithmetic of rules/slicing.egg does not follow (Python's ``%`` as remainder
plus sign fix-ups, divide, select, sign, clamp, an int convert that may wrap: JAX narrows ``r·w``
to the ids' type) gets the fact its per-rank values show exactly:
``rkaff`` (a·r + b: ``affine``), ``rkmod`` (w·((r + k) mod c): ``rmod``), ``rkdiv``
(floor(r / K): ``rdiv``). The spelling of x and x'
stops mattering: positions ``iota + r*w`` or a reshaped offset table plus a broadcast, causal
masks compared per block, ``(idx - i) % c`` rings, clamps, one-hot tables are just values.

Side conditions (soundness first, audit of issue 23):
- every value is computed in its own element type with XLA's semantics: two's-complement wrap
  of add/subtract/multiply/negate/abs/convert in narrow and unsigned types; integer divide and
  remainder truncate toward zero (computed exactly, 64-bit types in Python ints; a zero divisor
  or the signed MIN / -1 case gives no value); compares by the
  operand type (a ``type=`` attribute that disagrees with it gives no value); shifts only for
  amounts within the type's width;
- a value is evaluated only for int and pred types (floats never: rounding); a constant only
  when its literal is printed in full and every element fits its type (an elided ``{...}``
  literal is unknown); iotas with wrap (numpy's cast is two's complement);
- per rank at most MAX_ELEMENTS elements (the baseline's at most c times that); larger tensors
  get no value;
- with the device id, rank r's value is taken on every group's device r and must agree across
  groups (a value that depends on the group relates to nothing here);
- a fact is written only when the equality holds on all c ranks, element by element.

numpy is imported only when the distributed graph holds a rank-dependent non-scalar int or pred
tensor, so programs without one (most large models) pay a walk over their instructions only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...hlo.literals import INT_BITS
from ...ir import Instruction

if TYPE_CHECKING:
    from ..graph import Graphs

TABLES = ("rkdup", "rkshard", "rkaff", "rkmod", "rkdiv", "rkrot", "rkrot2", "rkany")
MAX_ELEMENTS = 1 << 16  # per rank (issue 25: ~64k)
OPCODES = frozenset({
    "parameter", "constant", "iota", "broadcast", "reshape", "transpose", "slice", "concatenate", "copy",
    "convert", "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs",
    "compare", "select", "clamp", "and", "or", "xor", "not", "shift-left", "shift-right-logical",
    "shift-right-arithmetic", "dynamic-slice", "sign",
})  # fmt: skip
# Rank arithmetic the rules follow themselves (rules/slicing.egg: affine); a rank scalar
# computed with anything else (remainder, divide, select, compare, sign, ...) is evaluated here.
AFFINE_OPS = frozenset({"parameter", "constant", "add", "subtract", "multiply", "convert", "reshape", "broadcast", "copy"})

Rows = dict[str, list[tuple[object, ...]]]


def _int_like(dtype: str) -> bool:
    return dtype in INT_BITS or dtype == "pred"


def _holds(src: str, dst: str) -> bool:
    """Every value of int type ``src`` is a value of ``dst`` (a convert that never wraps)."""
    if src not in INT_BITS or dst not in INT_BITS:
        return False
    bs, bd = INT_BITS[src], INT_BITS[dst]
    if src[0] == dst[0]:
        return bd >= bs
    return src[0] == "u" and bd > bs


def graph_rows(rows: Rows, g: Graphs) -> None:
    """rkdup / rkshard rows of ``g`` (ids are g's node ids)."""
    c = g.spec.c
    dist = [n for n in g.nodes if n.side == "distributed"]
    # Which distributed values are functions of the rank (or device id) and literals only.
    rank_dep: dict[int, bool] = {}  # gid -> depends on the rank; absent: not evaluable
    nonaffine: set[int] = set()  # computed with an op outside AFFINE_OPS
    for n in dist:
        ins = n.ins
        if not _int_like(ins.shape.dtype) or ins.shape.is_tuple or ins.opcode not in OPCODES or ins.shape.numel > MAX_ELEMENTS:
            continue
        if ins.opcode == "parameter":
            if ins.name in g.rank_params or ins.parsed.get("device_id"):
                rank_dep[n.gid] = True
            continue
        if all(o in rank_dep for o in n.operands):
            rank_dep[n.gid] = any(rank_dep[o] for o in n.operands)
            if ins.opcode not in AFFINE_OPS or any(o in nonaffine for o in n.operands) or (ins.opcode == "convert" and not _holds(g.nodes[n.operands[0]].ins.shape.dtype, ins.shape.dtype)):
                nonaffine.add(n.gid)  # (the rules follow only converts that keep every value)
    scalars = [gid for gid, dep in rank_dep.items() if dep and gid in nonaffine and g.nodes[gid].ins.shape.numel == 1 and g.nodes[gid].ins.shape.dtype in INT_BITS]
    wanted = [gid for gid, dep in rank_dep.items() if dep and g.nodes[gid].ins.shape.rank >= 1]
    if not wanted and not scalars:
        return
    # The baseline's literal-only int/pred values, found structurally first: a rank-dependent
    # value whose shape could be none of theirs (equal, or one dim c times larger) is not
    # evaluated at all, so most programs never import numpy here.
    literal_only: set[int] = set()
    shapes: set[tuple[str, tuple[int, ...]]] = set()
    for n in g.nodes:
        ins = n.ins
        if n.side != "baseline" or not _int_like(ins.shape.dtype) or ins.shape.is_tuple or ins.opcode not in OPCODES or ins.opcode == "parameter":
            continue
        if ins.shape.numel <= MAX_ELEMENTS * c and all(o in literal_only for o in n.operands):
            literal_only.add(n.gid)
            if ins.shape.rank >= 1:
                shapes.add((ins.shape.dtype, tuple(ins.shape.dims)))

    def could_match(gid: int) -> bool:
        dt, dims = g.nodes[gid].ins.shape.dtype, tuple(g.nodes[gid].ins.shape.dims)
        return (dt, dims) in shapes or any((dt, _grown(dims, c, d)) in shapes for d in range(len(dims))) or any(
            (dt, _grown(dims, c, da, db)) in shapes for da in range(len(dims)) for db in range(da + 1, len(dims)))

    wanted = [gid for gid in wanted if could_match(gid)] + scalars
    if not wanted:
        return
    import numpy as np

    groups = g.spec.groups
    per_rank: list[dict[int, Any]] = []
    for r in range(c):
        agreed: dict[int, Any] | None = None
        for group in groups:
            ev = _Eval(np, g, {"rank": r, "device": group[r] if r < len(group) else None}, MAX_ELEMENTS)
            vals = {gid: ev.value(gid) for gid in wanted}
            if agreed is None:
                agreed = vals
            else:
                agreed = {gid: v for gid, v in agreed.items() if v is not None and vals.get(gid) is not None and np.array_equal(v, vals[gid])}
        per_rank.append(agreed or {})
    known = [gid for gid in wanted if all(per_rank[r].get(gid) is not None for r in range(c))]
    for gid in scalars:
        if gid in known:
            _scalar_rows(rows, gid, [int(per_rank[r][gid].reshape(())) for r in range(c)])
    known = [gid for gid in known if gid not in set(scalars)]
    if not known:
        return
    # The baseline's literal-only int/pred tensors, by (dtype, dims, bytes).
    base_ev = _Eval(np, g, {}, MAX_ELEMENTS * c)
    table: dict[tuple[str, tuple[int, ...], bytes], list[int]] = {}
    for gid in sorted(literal_only):
        n = g.nodes[gid]
        if n.ins.shape.rank == 0:
            continue
        v = base_ev.value(n.gid)
        if v is not None:
            table.setdefault((n.ins.shape.dtype, tuple(n.ins.shape.dims), v.tobytes()), []).append(n.gid)
    if not table:
        return
    # The same values by shape (numpy dtype string, dims), for the rotated blocks.
    by_shape: dict[tuple[str, tuple[int, ...]], list[tuple[Any, list[int]]]] = {}
    for (_, dims_, _), gids in table.items():
        first = base_ev.value(gids[0])
        by_shape.setdefault((first.dtype.str, dims_), []).append((first, gids))
    for gid in known:
        ins = g.nodes[gid].ins
        vals = [per_rank[r][gid] for r in range(c)]
        dt, dims = ins.shape.dtype, tuple(ins.shape.dims)
        if all(np.array_equal(vals[0], v) for v in vals[1:]):
            for b in table.get((dt, dims, vals[0].tobytes()), []):
                rows["rkdup"].append((b, gid))
        for d in range(len(dims)):
            whole = np.ascontiguousarray(np.concatenate(vals, axis=d))
            for b in table.get((dt, tuple(whole.shape), whole.tobytes()), []):
                rows["rkshard"].append((b, gid, d))
        _rotated_rows(np, rows, gid, vals, by_shape)


def _grown(dims: tuple[int, ...], c: int, *ds: int) -> tuple[int, ...]:
    """``dims`` with each dim in ``ds`` c times larger (the baseline shape a block of it is cut from)."""
    return tuple(n * c if i in ds else n for i, n in enumerate(dims))


def _block(x: Any, cuts: dict[int, int], sizes: tuple[int, ...]) -> Any:
    """Block ``cuts[d]`` along each cut dim d of ``x``, in pieces of ``sizes[d]``."""
    return x[tuple(slice(cuts[d] * n, (cuts[d] + 1) * n) if d in cuts else slice(None) for d, n in enumerate(sizes))]


def _rotated_rows(np: Any, rows: Rows, gid: int, vals: list[Any], by_shape: dict[tuple[str, tuple[int, ...]], list[tuple[Any, list[int]]]]) -> None:
    """rkrot / rkrot2 rows of the distributed value ``gid`` (vals[r]: its value on rank r).

    rkrot(b, d, e, k): vals[r] is block (r + k) mod c along e of b's value, for every r
    (0 < k < c; k = 0 is rkshard). rkrot2(b, d, da, ka, db, kb): vals[r] is the block
    (r + ka) mod c along da and (r + kb) mod c along db at once (a causal mask's block at ring
    step k: query block r, key block (r - k) mod c). Rank 0's value fixes the candidate offsets
    (every block of b equal to it); a row is written only when every rank's value is that
    rank's block exactly. For pred values, rkany rows say which of them hold a given value in
    every line along a dim on every rank (a mask block with a kept key in every query row)."""
    c = len(vals)
    dims = tuple(vals[0].shape)
    dt = vals[0].dtype
    found = False
    for e in range(len(dims)):
        for bval, bgids in by_shape.get((dt.str, _grown(dims, c, e)), []):
            for k in range(1, c):
                if all(np.array_equal(_block(bval, {e: (r + k) % c}, dims), vals[r]) for r in range(c)):
                    found = True
                    rows["rkrot"].extend((b, gid, e, k) for b in bgids)
    for da in range(len(dims)):
        for db in range(len(dims)):
            if da == db:
                continue
            for bval, bgids in by_shape.get((dt.str, _grown(dims, c, da, db)), []):
                for ka in range(c):
                    for kb in range(c):
                        if all(np.array_equal(_block(bval, {da: (r + ka) % c, db: (r + kb) % c}, dims), vals[r]) for r in range(c)):
                            found = True
                            rows["rkrot2"].extend((b, gid, da, ka, db, kb) for b in bgids)
    if found and vals[0].dtype == np.bool_:
        for d in range(len(dims)):
            for v in (True, False):
                if all(bool((x == v).any(axis=d).all()) for x in vals):
                    rows["rkany"].append((gid, d, int(v)))


def _scalar_rows(rows: Rows, gid: int, seq: list[int]) -> None:
    """The rank-arithmetic facts a scalar's per-rank values seq[r] show: a·r + b (affine),
    w·((r + k) mod c) (rmod, rules/ringcollect.egg), floor(r / K) (rdiv) - each only when it
    holds on every rank exactly."""
    from ...hlo.rank import _rotated

    c = len(seq)
    a = seq[1] - seq[0] if c > 1 else 0
    if all(v == a * r + seq[0] for r, v in enumerate(seq)):
        rows["rkaff"].append((gid, a, seq[0]))
        return
    rot = _rotated(seq)
    if rot is not None:
        rows["rkmod"].append((gid, rot[0], rot[1]))
    for k in range(2, c):
        if c % k == 0 and all(v == r // k for r, v in enumerate(seq)):
            rows["rkdiv"].append((gid, k))


class _Eval:
    """Exact values of one side's int/pred instructions under ``env`` (rank, device id)."""

    def __init__(self, np: Any, g: Graphs, env: dict[str, int | None], limit: int) -> None:
        self.np, self.g, self.env, self.limit = np, g, env, limit
        self.memo: dict[int, Any] = {}

    def value(self, gid: int) -> Any:
        """The array of node ``gid``, or None when it is not computed exactly here."""
        stack = [gid]
        while stack:  # operands first, without recursion (chains can be long)
            top = stack[-1]
            if top in self.memo:
                stack.pop()
                continue
            n = self.g.nodes[top]
            todo = [o for o in n.operands if o not in self.memo]
            if todo and _int_like(n.ins.shape.dtype) and n.ins.opcode in OPCODES:
                stack.extend(todo)
                continue
            stack.pop()
            try:
                with self.np.errstate(over="ignore"):
                    self.memo[top] = self._eval(n.ins, [self.memo.get(o) for o in n.operands], [self.g.nodes[o].ins for o in n.operands])
            except (ValueError, TypeError, IndexError, OverflowError):
                self.memo[top] = None  # a shape or attribute the evaluator does not follow: unknown
        return self.memo[gid]

    def _eval(self, ins: Instruction, xs: list[Any], opnd: list[Instruction]) -> Any:
        np = self.np
        dt, dims, op = ins.shape.dtype, tuple(ins.shape.dims), ins.opcode
        if not _int_like(dt) or ins.shape.is_tuple or op not in OPCODES or ins.shape.numel > self.limit:
            return None
        if any(x is None for x in xs):
            return None
        npt = _np_type(np, dt)
        p = ins.parsed
        if op == "parameter":  # the baseline's evaluator has no rank: its parameters are unknown
            if ins.name in self.g.rank_params and self.env.get("rank") is not None:
                v = self.env["rank"]
            elif p.get("device_id") and self.env.get("device") is not None:
                v = self.env["device"]
            else:
                return None
            return np.array(v, dtype=np.int64).astype(npt).reshape(dims)
        if op == "constant":
            return _literal(np, ins, npt)
        if op == "iota":
            d = p.get("iota_dimension")
            if dt == "pred" or not isinstance(d, int) or not 0 <= d < len(dims):
                return None
            line = np.arange(dims[d], dtype=np.int64).astype(npt)  # wraps as XLA's iota does
            shape = [1] * len(dims)
            shape[d] = dims[d]
            return np.broadcast_to(line.reshape(shape), dims).copy()
        if op in ("copy", "reshape"):
            return xs[0].reshape(dims)
        if op == "broadcast":
            bd = [int(v) for v in p.get("dimensions", [])]
            x = xs[0]
            if len(bd) != x.ndim:
                return None
            order = sorted(range(len(bd)), key=lambda i: bd[i])
            x = np.transpose(x, order)
            shape = [1] * len(dims)
            for i in order:
                shape[bd[i]] = xs[0].shape[i]
            return np.broadcast_to(x.reshape(shape), dims).copy()
        if op == "transpose":
            return np.ascontiguousarray(np.transpose(xs[0], [int(v) for v in p.get("dimensions", [])]))
        if op == "slice":
            sl = p.get("slice")
            if not sl:
                return None
            return np.ascontiguousarray(xs[0][tuple(slice(a, b, s) for a, b, s in sl)])
        if op == "concatenate":
            return np.concatenate(xs, axis=int(p.get("dimensions", [0])[0]))
        if op == "dynamic-slice":
            sizes = [int(v) for v in p.get("dynamic_slice_sizes", [])]
            x = xs[0]
            if len(sizes) != x.ndim or len(xs) != 1 + x.ndim:
                return None
            starts = [min(max(int(s.reshape(())), 0), n - k) for s, n, k in zip(xs[1:], x.shape, sizes, strict=True)]  # XLA clamps
            return np.ascontiguousarray(x[tuple(slice(s, s + k) for s, k in zip(starts, sizes, strict=True))])
        src = opnd[0].shape.dtype if opnd else dt
        if op == "convert":
            if not _int_like(src):
                return None
            if dt == "pred":
                return xs[0] != 0
            return xs[0].astype(np.int64).astype(npt) if src == "pred" else xs[0].astype(npt)  # two's-complement wrap
        if op == "compare":
            return self._compare(ins, xs, src)
        if op == "select":
            return np.where(xs[0], xs[1], xs[2]).astype(npt).reshape(dims)
        if op == "clamp":
            return np.minimum(np.maximum(xs[1], xs[0]), xs[2]).astype(npt).reshape(dims)
        if op in ("and", "or", "xor"):
            f = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
            return f(xs[0], xs[1])
        if op == "not":
            return np.logical_not(xs[0]) if dt == "pred" else np.invert(xs[0])
        if dt == "pred":
            return None  # arithmetic on pred: not an HLO form the evaluator follows
        if op in ("add", "subtract", "multiply", "maximum", "minimum"):
            f = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}[op]
            return f(xs[0], xs[1]).astype(npt)  # same-type numpy arithmetic wraps like XLA's
        if op == "sign":
            return np.sign(xs[0]).astype(npt)
        if op == "negate":
            return np.negative(xs[0]).astype(npt)
        if op == "abs":
            return np.abs(xs[0]).astype(npt)  # abs(MIN) == MIN in both
        if op in ("divide", "remainder"):
            return _divmod(np, op, dt, npt, xs[0], xs[1])
        if op.startswith("shift"):
            bits = INT_BITS[dt]
            s = xs[1].astype(np.int64)
            if (s < 0).any() or (s >= bits).any():
                return None  # XLA's out-of-range shifts: not followed
            if op == "shift-left":
                return np.left_shift(xs[0], xs[1]).astype(npt)
            if op == "shift-right-arithmetic":
                return np.right_shift(xs[0].astype(_np_type(np, "s" + dt[1:])), xs[1]).astype(npt)
            return np.right_shift(xs[0].astype(_np_type(np, "u" + dt[1:])), xs[1]).astype(npt)
        return None

    def _compare(self, ins: Instruction, xs: list[Any], src: str) -> Any:
        np = self.np
        t = ins.attrs.get("type")
        if t is not None and t != ({"s": "SIGNED", "u": "UNSIGNED"}.get(src[0]) if src in INT_BITS else None):
            return None  # a comparison type that is not the operand type's own order
        d = ins.parsed.get("direction", ins.attrs.get("direction"))
        f = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater, "GE": np.greater_equal}.get(str(d))
        return None if f is None else f(xs[0], xs[1])


def _np_type(np: Any, dt: str) -> Any:
    return np.bool_ if dt == "pred" else np.dtype(("int" if dt[0] == "s" else "uint") + str(INT_BITS[dt]))


def _divmod(np: Any, op: str, dt: str, npt: Any, a: Any, b: Any) -> Any:
    """XLA's integer divide/remainder (truncating toward zero), exactly, or None."""
    if INT_BITS[dt] > 32:
        # 64-bit types (torch's positions are s64): exactly, in Python ints (numpy's int64
        # abs/sign would overflow at MIN and uint64 has no signed view).
        xs, ys = a.ravel().tolist(), b.ravel().tolist()
        if any(y == 0 for y in ys) or (dt[0] == "s" and any(x == -(1 << 63) and y == -1 for x, y in zip(xs, ys, strict=True))):
            return None
        qs = [abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1) for x, y in zip(xs, ys, strict=True)]
        out = qs if op == "divide" else [x - y * q for x, y, q in zip(xs, ys, qs, strict=True)]
        return np.array(out, dtype=npt).reshape(a.shape)  # every result is in range: no wrap
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if (b64 == 0).any():
        return None  # XLA defines x/0 and x%0 specially: not followed
    if dt[0] == "s" and ((a64 == -(1 << (INT_BITS[dt] - 1))) & (b64 == -1)).any():
        return None
    q = np.abs(a64) // np.abs(b64) * np.sign(a64) * np.sign(b64)
    return (q if op == "divide" else a64 - b64 * q).astype(npt)


def _literal(np: Any, ins: Instruction, npt: Any) -> Any:
    from ...hlo.parser import literal_is_elided

    text = ins.literal or ""
    if literal_is_elided(text):
        return None
    body = text.replace("{", " ").replace("}", " ").replace(",", " ").split()
    if len(body) != ins.shape.numel:
        return None
    vals: list[int] = []
    dt = ins.shape.dtype
    lo, hi = (0, 1) if dt == "pred" else ((0, (1 << INT_BITS[dt]) - 1) if dt[0] == "u" else (-(1 << (INT_BITS[dt] - 1)), (1 << (INT_BITS[dt] - 1)) - 1))
    for t in body:
        if t in ("true", "false"):
            vals.append(1 if t == "true" else 0)
            continue
        try:
            v = int(t, 0)
        except ValueError:
            return None
        if not lo <= v <= hi:
            return None  # a literal that does not fit its type: no value
        vals.append(v)
    arr = np.array(vals, dtype=np.int64 if dt[0] == "s" or dt == "pred" else np.uint64)
    return (arr != 0 if dt == "pred" else arr.astype(npt)).reshape(tuple(ins.shape.dims))
