"""Scatter as the analysis reads it: a typed, strict form of the instruction and the shape tables
of rules/scatter.egg.

``read_scatter`` turns a parsed ``scatter`` into a :class:`ScatterForm` or says why it cannot:
every attribute must be one it knows (an attribute it does not know could change the value, so
the instruction stays unsupported and can never verify), the combiner (``to_apply``) must be a
plain add/max/min/mul/and/or, or an overwrite (``ROOT p1``) whose updates provably never collide
(``overwrite_indices_distinct``: one-element updates, one index component an iota along the one
scatter dim; or ``overwrite_slots_distinct``: a MoE's routed slots, distinct on every kept token,
the dropped ones parked on a scratch slot no reader sees; an overwrite at colliding indices that
are read depends on the order of the updates and stays unsupported), and the dimension numbers
must fit the operand shapes.

The tables (one row per signature key, written only for the forms the laws are stated for):

``scatpick(k, d, n)``        k is ``index_add`` along d with one index: operand with n elements
                             along d, indices s[1], updates of the operand's shape with 1 at d,
                             combiner add (the backward of index_select of one element)
``scatrows(kb, kp, w)``      baseline k is ``index_add`` along 0 (an embedding's backward) into
                             c·w rows; kp the same scatter into w rows (per rank), no promises
``scatmask(kbc, kp)``        kbc broadcasts a pred per index over the update rows of distributed
                             scatter kp (index_add along 0)
``catone(k)``                a concatenate of one operand (the identity)
``scatcomb(k, op)``          k's combiner is op (add, max, min) — the partial-sum law
``gplin(k)``                 linear unary maps (reshape, transpose, broadcast, slice, copy,
                             negate) of the group-partial relation, keys of baseline signatures
``gplin2(k, op)``            add / subtract / multiply (baseline signatures)
``gpdot(k, dl, el, dr, er, K, d2, kp)``  dot contracting the pair (el, er) that grp blocks by
                             r mod K, (dl, dr) a batch pair the result keeps at d2
``gpred(k, d, K, e, d2, kp)`` reduce(add) whose dimensions include e (blocked r mod K) but not
                             d; e = -1: any reduce(add) keeping d (of a group-partial sum)
``gpdus(k, d, K, kp)``       dynamic-update-slice that keeps d whole (literal 0 start there)
``gppad(k, d, K, kp)``       pad that leaves d unpadded

Side conditions (audit, issue 23): combiners other than add/max/min/mul/and/or and attributes
not understood leave the scatter unsupported; the partial law needs identical indices on every
rank (an update out of bounds is dropped alike on both sides); integer combiners wrap alike
(exact modulo 2^bits); the rank-group tables index within one sharding group (floor(r/K)).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hlo.literals import INT_BITS, int_range
from ..ir import Instruction, Module, Shape
from .ops import VALUE_NEUTRAL_ATTRS
from .signature import Dims, Sig, gscale

# Attributes of scatter the reader understands; anything else keeps the scatter unsupported.
KNOWN_ATTRS = frozenset(
    {
        "update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
        "index_vector_dim", "indices_are_sorted", "unique_indices", "input_batching_dims",
        "scatter_indices_batching_dims", "to_apply", "reducer",
    }
)  # fmt: skip
COMBINERS = frozenset({"add", "max", "min", "mul", "and", "or"})
LINEAR_UNARY = frozenset({"reshape", "transpose", "broadcast", "slice", "copy", "negate"})
LINEAR_BINARY = frozenset({"add", "subtract", "multiply"})


@dataclass(frozen=True)
class ScatterForm:
    """One scatter's dimension numbers and combiner (XLA's operation semantics)."""

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    indices_are_sorted: bool
    unique_indices: bool
    combiner: str  # add | max | min | mul | and | or | overwrite (only with distinct indices)

    def index_add_dim(self, operand: Dims, indices: Dims, updates: Dims) -> tuple[int, int] | None:
        """(d, N) when this is ``index_add`` along d with N scalar indices: indices s[N] (index
        vector dim 1, implicit) or s[N, 1], updates of the operand's shape with N at d, every
        other operand dim a whole window dim in place, no batching dims."""
        if self.input_batching_dims or self.scatter_indices_batching_dims:
            return None
        if self.index_vector_dim != 1 or not (len(indices) == 1 or (len(indices) == 2 and indices[1] == 1)):
            return None
        if len(self.inserted_window_dims) != 1 or self.scatter_dims_to_operand_dims != self.inserted_window_dims:
            return None
        d = self.inserted_window_dims[0]
        if not 0 <= d < len(operand) or len(updates) != len(operand):
            return None
        if self.update_window_dims != tuple(x for x in range(len(operand)) if x != d):
            return None
        n_idx = indices[0]
        if updates != tuple(n_idx if x == d else operand[x] for x in range(len(operand))):
            return None
        return d, n_idx


def is_overwrite(reducer: object) -> bool:
    """The combiner ``(a, b) -> b`` (torch's ``scatter``/``F.one_hot``, JAX's ``.at[].set``), as
    the normalizer prints a reducer it does not classify (hlo/normalize.body_text): two scalar
    parameters of one type, the root the second one."""
    if not isinstance(reducer, str) or not reducer.startswith("body:"):
        return False
    parts = reducer[len("body:"):].split("; ")
    if len(parts) != 2:
        return False
    first, root = parts
    ty = first.partition(":")[2]
    return first.startswith("p0:") and root == f"ROOT p1:{ty}" and ty.endswith("[](){}") and "[]" in ty


def overwrite_indices_distinct(ins: Instruction, module: Module) -> bool:
    """An overwriting scatter never has two updates on one element: every update is one element
    (no update window dims, no batching dims) and one component of the index vectors is an iota
    along the one scatter dim of the indices whose extent exceeds 1 (every other scatter dim
    has extent 1), in a type that holds that extent (no wrap). Then the index vectors of any two
    updates differ in that component, so the updates land on distinct elements or (out of
    bounds) are dropped, which XLA does alike in every program: the result does not depend on
    an order. The form F.one_hot lowers to: indices concatenate(iota over rows, class ids)."""
    p = ins.parsed
    if p.get("update_window_dims") or p.get("input_batching_dims") or p.get("scatter_indices_batching_dims"):
        return False
    idx = module.entry.get(ins.operands[1]) if len(ins.operands) == 3 else None
    if idx is None:
        return False
    dims = tuple(idx.shape.dims)
    ivd = p.get("index_vector_dim")
    if not isinstance(ivd, int) or not 0 <= ivd <= len(dims):
        return False
    scatter_dims = [x for x in range(len(dims)) if x != ivd]
    long = [x for x in scatter_dims if dims[x] != 1]
    if len(long) > 1:
        return False
    if not long:
        return True  # at most one update
    d = long[0]
    if ivd == len(dims) or dims[ivd] == 1:
        pieces = [idx]
    elif idx.opcode == "concatenate" and list(idx.parsed.get("dimensions", [])) == [ivd]:
        pieces = [module.entry.get(o) for o in idx.operands]
    else:
        return False
    for piece in pieces:
        if piece is None or piece.opcode != "iota" or piece.parsed.get("iota_dimension") != d:
            continue
        pd = tuple(piece.shape.dims)
        if len(pd) != len(dims) or (ivd < len(dims) and pd[ivd] != 1) or piece.shape.dtype not in INT_BITS:
            continue
        if dims[d] - 1 <= int_range(piece.shape.dtype)[1]:
            return True
    return False


def read_scatter(ins: Instruction, operands: list[Shape], module: Module | None = None) -> ScatterForm | str:
    """The scatter's form, or why it is not understood (the reason of an unsupported finding).
    An overwriting combiner is read only with ``module`` and only when its updates provably
    never collide (:func:`overwrite_indices_distinct`)."""
    p = ins.parsed
    unknown = sorted(k for k in set(ins.attrs) | set(p) if k not in KNOWN_ATTRS and k not in VALUE_NEUTRAL_ATTRS)
    if unknown:
        return f"scatter attribute(s) {', '.join(unknown)} not understood"
    if ins.shape.is_tuple or len(operands) != 3:
        return "variadic scatter (several operands and updates) has no rules"
    reducer = p.get("reducer")
    if is_overwrite(reducer) and module is not None and (overwrite_indices_distinct(ins, module) or overwrite_slots_distinct(ins, module)):
        reducer = "overwrite"
    elif reducer not in COMBINERS:
        return ("scatter whose combiner is not a plain add/max/min/mul/and/or (an overwrite depends on the "
                "order of colliding updates unless the indices are unique, which is not proven: "
                "one index component must be an iota along the one scatter dim, updates single elements)")
    try:
        form = ScatterForm(
            tuple(int(x) for x in p.get("update_window_dims", [])),
            tuple(int(x) for x in p.get("inserted_window_dims", [])),
            tuple(int(x) for x in p.get("scatter_dims_to_operand_dims", [])),
            int(p["index_vector_dim"]),
            tuple(int(x) for x in p.get("input_batching_dims", [])),
            tuple(int(x) for x in p.get("scatter_indices_batching_dims", [])),
            _flag(p.get("indices_are_sorted", False)),
            _flag(p.get("unique_indices", False)),
            str(reducer),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return f"scatter dimension numbers not understood ({exc})"
    operand, indices, updates = (tuple(s.dims) for s in operands)
    if ins.shape.dims != operand or operands[2].dtype != ins.shape.dtype or operands[0].dtype != ins.shape.dtype:
        return "scatter whose result shape is not its operand's"
    windows = len(form.update_window_dims) + len(form.inserted_window_dims) + len(form.input_batching_dims)
    if windows != len(operand) or not 0 <= form.index_vector_dim <= len(indices):
        return "scatter dimension numbers do not fit the operand shape"
    vec = indices[form.index_vector_dim] if form.index_vector_dim < len(indices) else 1
    if len(form.scatter_dims_to_operand_dims) != vec or any(not 0 <= x < len(operand) for x in form.scatter_dims_to_operand_dims):
        return "scatter_dims_to_operand_dims does not fit the index vector"
    if len(updates) != len(form.update_window_dims) + len(indices) - (1 if form.index_vector_dim < len(indices) else 0):
        return "scatter updates rank does not fit the dimension numbers"
    return form


def _batch_dims(form: ScatterForm, indices: Dims, updates: Dims) -> tuple[int, int] | None:
    """(di, du) when the scatter has exactly one scatter dim: di of the indices (not the index
    vector dim) and du of the updates (not a window dim), the i-th index along di placing the
    i-th update along du; no batching dims. None otherwise."""
    if form.input_batching_dims or form.scatter_indices_batching_dims:
        return None
    idx = [x for x in range(len(indices)) if x != form.index_vector_dim]
    upd = [x for x in range(len(updates)) if x not in form.update_window_dims]
    if len(idx) != 1 or len(upd) != 1 or indices[idx[0]] != updates[upd[0]]:
        return None
    return idx[0], upd[0]


def _flag(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError(f"not a boolean: {v!r}")


def scatter_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    """scatpick / scatrows / scatcomb rows of one scatter instruction."""
    form = read_scatter(ins, opnd)
    if isinstance(form, str):
        return
    key = sig.key()
    if form.combiner in ("add", "max", "min"):
        rows["scatcomb"].append((key, form.combiner))
    operand, indices, updates = (tuple(s.dims) for s in opnd)
    batch = _batch_dims(form, indices, updates)
    if side == "distributed" and form.combiner == "add" and batch is not None:
        # The indices and their updates split over the ranks along their one scatter (batch)
        # dim: kp is the baseline's scatter of all c blocks (rules/scatter.egg scatter-batch-split).
        di, du = batch
        whole_i = tuple(n * c if x == di else n for x, n in enumerate(indices))
        whole_u = tuple(n * c if x == du else n for x, n in enumerate(updates))
        rows["scatbatch"].append((key, di, du, sig.with_dims([operand, whole_i, whole_u], operand).key()))
    pick = form.index_add_dim(operand, indices, updates)
    if pick is None or form.combiner != "add":
        return
    d, n_idx = pick
    if side == "distributed" and n_idx == 1:
        # One index: the promises (sorted, unique) hold whatever they say.
        rows["scatpick"].append((key, d, operand[d]))
    if side == "distributed" and d == 0 and len(indices) in (1, 2):
        # The mask of the embedding backward, one pred per index spread over its update row.
        mask = Sig("broadcast", (("dimensions", "[0]"),), (("pred", (n_idx,)),), ("pred", updates)).key()
        rows["scatmask"].append((mask, key))
    if side == "baseline" and d == 0 and operand[0] % c == 0 and operand[0] >= c and not form.unique_indices and not form.indices_are_sorted:
        # Rank r's scatter writes into its w = V/c rows; its masked indices repeat (every
        # token outside the block lands on row 0 with a zero update), so it must promise nothing.
        w = operand[0] // c
        kp = sig.with_dims([(w, *operand[1:]), indices, updates], (w, *operand[1:])).key()
        rows["scatrows"].append((key, kp, w))


def scatter_group_factors(ins: Instruction, opnd: list[Shape], c: int) -> set[int]:
    """{K} when ``ins`` is index_add of one element along a dim of n = c/K elements (the
    backward of a rank-group index_select), else {}."""
    form = read_scatter(ins, opnd)
    if isinstance(form, str) or form.combiner != "add":
        return set()
    operand = tuple(opnd[0].dims)
    pick = form.index_add_dim(operand, tuple(opnd[1].dims), tuple(opnd[2].dims))
    if pick is None or pick[1] != 1 or not operand[pick[0]] or c % operand[pick[0]]:
        return set()
    return {c // operand[pick[0]]}


def group_partial_rows(rows: dict[str, list[tuple[object, ...]]], sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims, factors: list[int], c: int, literal_zero: list[bool]) -> None:
    """gplin / gplin2 / gpdot / gpred / gpdus / gppad rows of one baseline signature for the group
    factors K of the distributed graph's rank-indexed index_selects. ``literal_zero[i]``: operand
    i is a scalar integer literal 0 (dynamic-update-slice starts)."""
    op, key = sig.opcode, sig.key()
    if op in LINEAR_UNARY:
        rows["gplin"].append((key,))
    if op in LINEAR_BINARY and len(ins_dims) == 2:
        rows["gplin2"].append((key, op))
    for k in factors:
        if op == "dot" and len(ins_dims) == 2:
            _gpdot(rows, sig, ins, ins_dims, out, k, c)
        elif op == "reduce" and len(ins_dims) == 2 and ins.parsed.get("reducer") == "add":
            dims = sorted(int(x) for x in ins.parsed.get("dimensions", []))
            for d in range(len(ins_dims[0])):
                if d in dims:
                    continue
                d2 = d - sum(1 for x in dims if x < d)
                for e in (-1, *dims):
                    si, so = gscale(ins_dims[0], d, k, e, c), gscale(out, d2, k, -1, c)
                    if si and so:
                        rows["gpred"].append((key, d, k, e, d2, sig.with_dims([si, ins_dims[1]], so).key()))
        elif op == "dynamic-update-slice" and len(ins_dims) >= 3:
            base, upd = ins_dims[0], ins_dims[1]
            for d in range(len(base)):
                if d + 2 >= len(literal_zero) or not literal_zero[d + 2] or upd[d] != base[d]:
                    continue
                sb, su = gscale(base, d, k, -1, c), gscale(upd, d, k, -1, c)
                if sb and su:
                    rows["gpdus"].append((key, d, k, sig.with_dims([sb, su, *ins_dims[2:]], sb).key()))
        elif op == "pad" and len(ins_dims) == 2:
            cfg = _pad_config(ins)
            if cfg is None or len(cfg) != len(out):
                continue
            for d in range(len(out)):
                if cfg[d] != (0, 0, 0):
                    continue
                si, so = gscale(ins_dims[0], d, k, -1, c), gscale(out, d, k, -1, c)
                if si and so:
                    rows["gppad"].append((key, d, k, sig.with_dims([si, ins_dims[1]], so).key()))


def _pad_config(ins: Instruction) -> list[tuple[int, int, int]] | None:
    """(low, high, interior) per dim from ``padding=0_0x1_2_0...``."""
    text = ins.attrs.get("padding")
    if not isinstance(text, str):
        return None
    out = []
    for part in text.strip().split("x"):
        nums = part.split("_")
        if len(nums) not in (2, 3):
            return None
        try:
            vals = [int(v) for v in nums]
        except ValueError:
            return None
        out.append((vals[0], vals[1], vals[2] if len(vals) == 3 else 0))
    return out


def _gpdot(rows: dict[str, list[tuple[object, ...]]], sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims, k: int, c: int) -> None:
    p = ins.parsed
    lb, rb = [int(x) for x in p.get("lhs_batch_dims", [])], [int(x) for x in p.get("rhs_batch_dims", [])]
    lc, rc = [int(x) for x in p.get("lhs_contracting_dims", [])], [int(x) for x in p.get("rhs_contracting_dims", [])]
    lhs, rhs = ins_dims
    for i, (dl, dr) in enumerate(zip(lb, rb, strict=False)):
        for el, er in zip(lc, rc, strict=False):
            sl, sr, so = gscale(lhs, dl, k, el, c), gscale(rhs, dr, k, er, c), gscale(out, i, k, -1, c)
            if sl and sr and so:
                rows["gpdot"].append((sig.key(), dl, el, dr, er, k, i, sig.with_dims([sl, sr], so).key()))


SCATTER_TABLES = ("scatpick", "scatrows", "scatmask", "scatcomb", "catone", "gplin", "gplin2", "gpdot", "gpred", "gpdus", "gppad", "scatbatch")


# ---- Routed slots (a MoE's sparse dispatch): an overwrite whose kept indices are distinct.
#
# DeepSpeed's _sparse_encode writes token t's id at slot[t] = h[t]*C' + loc[t] when h[t] >= 0,
# else at a scratch slot X that every reader drops (``source[:-1]``). Kept slots are distinct:
# M (tokens x experts) is a 0/1 matrix, each row at most one 1, at column a[t] (a one-hot of
# a[t] times 0/1 capacity masks), each column at most K ones (a capacity mask writes K ones per
# column). h[t] = min(a[t], rowsum(M)[t]*E' - 1) with E' >= E is a[t] on a kept row and < 0 on
# a dropped one; loc[t] = sum_e (cumsum_tokens(M) - 1)*M = (ones of column a[t] up to t) - 1,
# in [0, K) and strictly increasing down a column; with C' >= K, h*C' + loc differs for any
# two kept tokens. Only updates at X may collide, and no reader sees X: the result read is
# order-independent. Every step below is checked on the HLO; anything else stays unsupported.


def _const_int(module: Module, name: str) -> int | None:
    """The integer every element of ``name`` equals (a scalar constant, broadcast/reshaped,
    or a product/sum/difference of such), else None."""
    ins = module.entry.get(name)
    if ins is None or ins.shape.dtype not in INT_BITS:
        return None
    if ins.opcode == "constant":
        try:
            return int(str(ins.literal).strip())
        except ValueError:
            return None
    if ins.opcode in ("broadcast", "reshape", "slice", "copy") and len(ins.operands) == 1:
        return _const_int(module, ins.operands[0])  # every element of a uniform tensor, moved
    if ins.opcode in ("multiply", "add", "subtract") and len(ins.operands) == 2:
        x, y = (_const_int(module, o) for o in ins.operands)
        if x is None or y is None:
            return None
        v = x * y if ins.opcode == "multiply" else x + y if ins.opcode == "add" else x - y
        lo, hi = int_range(ins.shape.dtype)
        return v if lo <= v <= hi else None
    return None


def _vector_like(ins: Instruction, n: int) -> bool:
    """A shape holding n elements along one dim (others 1): reshapes between such keep order."""
    dims = tuple(ins.shape.dims)
    return ins.shape.dtype in INT_BITS and (n == 1 or (sum(1 for d in dims if d != 1) == 1 and max(dims) == n)) and all(d >= 1 for d in dims)


def _strip(module: Module, name: str, n: int, lo: int = 1, hi: int = 0) -> str:
    """Follow reshapes, one-operand concatenates and exact converts of an n-vector back to where
    the value is computed. A convert is exact when its source type fits in its target type, or
    when [lo, hi] (the caller's proven bound on the value; empty by default) does."""
    while True:
        ins = module.entry.get(name)
        if ins is None or not _vector_like(ins, n) or len(ins.operands) != 1:
            return name
        src = module.entry.get(ins.operands[0])
        if src is None or not _vector_like(src, n):
            return name
        if ins.opcode == "convert":
            a, b = int_range(ins.shape.dtype)
            sa, sb = int_range(src.shape.dtype)
            if not (a <= sa and sb <= b) and not a <= lo <= hi <= b:
                return name
        elif ins.opcode not in ("reshape", "concatenate", "bitcast"):
            return name
        name = src.name


def _scaled(module: Module, name: str) -> tuple[str, int]:
    """(x, k) for multiply(x, k) with k a constant, else (name, 1)."""
    ins = module.entry.get(name)
    if ins is not None and ins.opcode == "multiply" and len(ins.operands) == 2:
        for a, b in (ins.operands, ins.operands[::-1]):
            k = _const_int(module, b)
            if k is not None:
                return a, k
    return name, 1


def _ones_scatter(module: Module, name: str) -> Instruction | None:
    """An overwrite scatter of constant 1 into constant 0 of an [S, E] int matrix, one element
    per update: its result is 0/1 whatever the order of its updates (all write the same 1)."""
    ins = module.entry.get(name)
    if ins is None or ins.opcode != "scatter" or len(ins.operands) != 3 or len(ins.shape.dims) != 2:
        return None
    p = ins.parsed
    if not is_overwrite(p.get("reducer")) or p.get("update_window_dims") or list(p.get("inserted_window_dims", [])) != [0, 1]:
        return None
    if list(p.get("scatter_dims_to_operand_dims", [])) != [0, 1] or p.get("input_batching_dims") or p.get("scatter_indices_batching_dims"):
        return None
    if _const_int(module, ins.operands[0]) != 0 or _const_int(module, ins.operands[2]) != 1:
        return None
    return ins


def _index_components(module: Module, sc: Instruction) -> tuple[list[Instruction], int] | None:
    """The two index components (row, column) of a 2-D one-element scatter, each [.., 1, ..]
    at the index vector dim, and that dim."""
    idx = module.entry.get(sc.operands[1])
    ivd = sc.parsed.get("index_vector_dim")
    if idx is None or not isinstance(ivd, int) or ivd >= len(idx.shape.dims) or idx.shape.dims[ivd] != 2:
        return None
    if idx.opcode != "concatenate" or list(idx.parsed.get("dimensions", [])) != [ivd] or len(idx.operands) != 2:
        return None
    pieces = [module.entry.get(o) for o in idx.operands]
    if any(x is None or x.shape.dims[ivd] != 1 for x in pieces):
        return None
    return pieces, ivd  # type: ignore[return-value]


def _is_iota_over(piece: Instruction, ivd: int, extent: int) -> bool:
    """An iota along the one index dim of ``extent`` elements (other scatter dims may repeat it)."""
    d = piece.parsed.get("iota_dimension")
    return piece.opcode == "iota" and isinstance(d, int) and d != ivd and piece.shape.dims[d] == extent and piece.shape.dtype in INT_BITS and extent - 1 <= int_range(piece.shape.dtype)[1]


def _routing_mask(module: Module, name: str, s: int) -> tuple[str, int, int] | None:
    """(a, E, K) when ``name`` is M: 0/1 [S, E], row t's only possible 1 at column a[t] (a one-hot
    factor: row component an iota over the S tokens, column component a), and at most K ones
    per column (K = updates per column of a capacity factor whose column component is an iota
    over E; K = S without one)."""
    ins = module.entry.get(name)
    if ins is None or len(ins.shape.dims) != 2 or ins.shape.dims[0] != s or ins.shape.dtype not in INT_BITS:
        return None
    factors = list(ins.operands) if ins.opcode == "multiply" and len(ins.operands) == 2 else [name]
    e = ins.shape.dims[1]
    a_name, k = None, s
    for f in factors:
        sc = _ones_scatter(module, f)
        if sc is None or tuple(sc.shape.dims) != (s, e):
            return None
        comps = _index_components(module, sc)
        if comps is None:
            return None
        (row, col), ivd = comps
        idx_dims = [x for i, x in enumerate(module.entry[sc.operands[1]].shape.dims) if i != ivd]
        n_upd = 1
        for x in idx_dims:
            n_upd *= x
        if a_name is None and n_upd == s and _is_iota_over(row, ivd, s) and sum(1 for x in idx_dims if x != 1) == 1:
            a_name = _strip(module, col.name, s)
        elif _is_iota_over(col, ivd, e) and n_upd % e == 0:
            k = min(k, n_upd // e)
        else:
            return None
    return (a_name, e, k) if a_name is not None else None


def overwrite_slots_distinct(ins: Instruction, module: Module) -> bool:
    """The routed-slot overwrite described above: 1-D operand, one-element updates, every
    reader a slice that skips the scratch slot X, indices select(h >= 0, h*C' + loc, X)."""
    p = ins.parsed
    if len(ins.shape.dims) != 1 or p.get("update_window_dims") or list(p.get("inserted_window_dims", [])) != [0]:
        return False
    if list(p.get("scatter_dims_to_operand_dims", [])) != [0] or p.get("input_batching_dims") or ins.is_root:
        return False
    idx = module.entry.get(ins.operands[1])
    if idx is None or p.get("index_vector_dim") != len(idx.shape.dims) - 1 or idx.shape.dims[-1] != 1:
        return False
    s = idx.shape.numel
    sel = module.entry.get(_strip(module, idx.name, s))
    if sel is None or sel.opcode != "select" or len(sel.operands) != 3:
        return False
    scratch = _const_int(module, sel.operands[2])
    if scratch is None or not _reads_skip(ins, module, scratch):
        return False
    cmp = module.entry.get(sel.operands[0])
    if cmp is None or cmp.opcode != "compare" or cmp.parsed.get("direction") != "GE" or _const_int(module, cmp.operands[1]) != 0:
        return False
    if any(k not in ("direction", "metadata") and k not in VALUE_NEUTRAL_ATTRS for k in set(cmp.attrs) | set(cmp.parsed)):
        return False  # a comparison type (UNSIGNED, say) would keep a dropped row's -1
    h = _routed_expert(module, cmp.operands[0], s)
    if h is None:
        return False
    h_name, m_name, e, k = h
    add = module.entry.get(sel.operands[1])
    if add is None or add.opcode != "add" or len(add.operands) != 2:
        return False
    for x, y in (add.operands, add.operands[::-1]):
        xh, c = _scaled(module, x)
        yl, one = _scaled(module, y)
        if one != 1 or c < k or (e * c) > int_range(add.shape.dtype)[1]:
            continue
        if _strip(module, xh, s, -(1 << 31), 1 << 20) == h_name and _location(module, _strip(module, yl, s, -s, s), s) == (m_name, k):
            return True
    return False


def _reads_skip(ins: Instruction, module: Module, x: int) -> bool:
    """Every user of ``ins`` is a slice none of whose read elements is x."""
    users = [u for u in module.entry.instructions if ins.name in u.operands]
    for u in users:
        if u.opcode != "slice":
            return False
        spec = u.parsed.get("slice")
        if not isinstance(spec, list) or len(spec) != 1 or len(spec[0]) != 3:
            return False
        start, limit, stride = (int(v) for v in spec[0])
        if stride < 1 or (start <= x < limit and (x - start) % stride == 0):
            return False
    return bool(users)


def _routed_expert(module: Module, name: str, s: int) -> tuple[str, str, int, int] | None:
    """(h, a, E, K) for h = min(a, rowsum(M)*E' - 1), E' >= E, after no-wrap converts. a comes
    from an integer type of at most 32 bits so that h fits in s32 [-2^31, E-1]."""
    h_name = _strip(module, name, s, -(1 << 31), 1 << 20)
    h = module.entry.get(h_name)
    if h is None or h.opcode != "minimum" or len(h.operands) != 2 or not h.shape.dtype.startswith("s"):
        return None  # signed: a dropped row's rowsum*E' - 1 is -1, not a wrapped maximum
    for a_op, q_op in (h.operands, h.operands[::-1]):
        q = module.entry.get(q_op)
        if q is None or q.opcode != "subtract" or _const_int(module, q.operands[1]) != 1:
            continue
        r_name, e2 = _scaled(module, q.operands[0])
        r = module.entry.get(r_name)
        if r is None or r.opcode != "reduce" or r.parsed.get("reducer") != "add" or list(r.parsed.get("dimensions", [])) != [1]:
            continue
        if len(r.operands) != 2 or _const_int(module, r.operands[1]) != 0:
            continue
        mask = _routing_mask(module, r.operands[0], s)
        if mask is None or e2 < mask[1] or e2 > 1 << 20 or int_range(r.shape.dtype)[1] < e2:
            continue
        a, e, k = mask
        src = module.entry.get(a_op)
        narrow = src is not None and src.opcode == "convert" and module.entry.get(src.operands[0]) is not None
        if not narrow or INT_BITS.get(module.entry[src.operands[0]].shape.dtype, 64) > 32:
            continue
        if _strip(module, a_op, s) != a:  # a: at most 32 bits, so h >= -2^31
            continue
        return h_name, r.operands[0], e, k
    return None


def _location(module: Module, name: str, s: int) -> tuple[str, int] | None:
    """(M, K) for loc = reduce_add over experts of (cumsum_tokens(M) - 1) * M."""
    red = module.entry.get(name)
    if red is None or red.opcode != "reduce" or red.parsed.get("reducer") != "add" or list(red.parsed.get("dimensions", [])) != [1]:
        return None
    if len(red.operands) != 2 or _const_int(module, red.operands[1]) != 0:
        return None
    mul = module.entry.get(red.operands[0])
    if mul is None or mul.opcode != "multiply" or len(mul.operands) != 2:
        return None
    for sub_op, m in (mul.operands, mul.operands[::-1]):
        sub = module.entry.get(sub_op)
        if sub is None or sub.opcode != "subtract" or _const_int(module, sub.operands[1]) != 1:
            continue
        cs = module.entry.get(sub.operands[0])
        if cs is None or cs.opcode != "reduce-window" or cs.parsed.get("reducer") != "add" or cs.operands[:1] != [m] or int_range(cs.shape.dtype)[1] < s:
            continue
        win = cs.parsed.get("window") or {}
        if set(win) != {"size", "pad"} or win["size"] != f"{s}x1" or win["pad"] != f"{s - 1}_0x0_0" or _const_int(module, cs.operands[1]) != 0:
            continue
        mask = _routing_mask(module, m, s)
        if mask is not None:
            return m, mask[2]
    return None
