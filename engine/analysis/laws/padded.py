"""Shape arithmetic of the padded relation (rules/padded.egg): facts about single signatures.

``pad x x' d w z``: the baseline x has n elements along d, and c·w >= n; rank r holds, at
position j < w along d, x[r·w + j] when r·w + j < n, and past the end (r·w + j >= n) zero
(z = 1) or some value (z = 0). Every other dim is whole. This is how Neuron lays out attention
heads and FFN features that do not divide over the ranks: padded to c·w, each rank a block.

Rows are keyed by the baseline signature k; kp is the per-rank signature (dim d of extent w).
The (n, w) pairs come from the relations file (padded inputs) and from distributed gathers by a
rank's own rows (``rows``), and reshapes derive more (splitting or merging the padded dim):

``pm1(k, d, w, d2, w2, zk, kp)``  unary k (pointwise, transpose, broadcast of the padded dim,
                                   reshape, slice taking d whole) maps pad(d, w) of its operand
                                   to pad(d2, w2); zk = 1 when it maps a zero tail to zeros.
``pm2(k, d, w, zr, kp)``          pointwise binary, both operands pad(d, w); zr says when the
                                   tail stays zero: "both" (f(0, 0) = 0), "either" (f(0, y) =
                                   f(x, 0) = 0: multiply, and), "none".
``pm2l(k, d, w, d2, w2, zk, kp)`` binary with pad(d, w) lhs and a duplicate rhs: a reduce over
                                   other dims (rhs = init; zk = 1 for add/max/min from their
                                   identity), a dot's free lhs dim (zk = 1).
``pm2r(k, d, w, d2, w2, zk, kp)`` a dot's free rhs dim, lhs duplicate.
``pm3(k, d, w, kp)``              select/clamp, all operands pad(d, w).
``pbn(k, d, w, kp)``              broadcast of a duplicate that creates (or expands from 1) d.
``pdb(k, dl, dr, w, e, kp)``      dot batch pair (dl, dr), both operands pad(., w): result dim e.
``pdc(k, dl, dr, w, kp)``         dot contracting pair (dl, dr), both pad(., w).
``psum(k, d, w, kp)``             reduce(add) over d (alone) from the add identity.
``pcat(k, d, w, kp)``             concatenate along another dim, every operand pad(d, w).
``padrows(k, d, w, Si)``          distributed: index_select along d (rows kept in place) of an
                                   operand with n <= c·w elements there by a w-entry index of
                                   shape Si (XLA's gather clamps an index past the end to n-1).
``pbslice(k, d, W, s, w, f, kp)`` padded in blocks (padb, spec s "n:w,..." from the relations
                                   file): slice k takes exactly one block of d, kp that block's
                                   w per-rank positions out of W; f = 1 when the block has no
                                   padding (c·w = n).
``pbsplit(k, d, W, s, e, w, kp)`` reshape splitting d of m equal blocks into (m, n/T, T...): the
                                   block index at e - 1 whole, pad(e, w) after it.
``pbns(k, d, W, s, kp)``          broadcast of a duplicate that creates d, for a spec s of that
                                   total: every index holds the same value, so any layout holds.

The pad tables' rows serve padb too where the width stays W (an op acting on each index of d
alone, in place, keeps every block's layout; see rules/padded.egg).

Side conditions (audit, issue 23): the zero-tail sets (ZERO_UNARY/ZERO_BOTH/ZERO_EITHER) list
only maps with f(0) = 0 for every element type they accept (integers of any width exactly,
floats on finite values); a declared int_range never reaches the tail as a baseline bound
(inputs.range_seeds); the padded width and extent come from the relations file or a rank's
own-rows gather whose index is an exact position (rules/rankpos.egg rpos).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir import Instruction, Module, Shape
from ...relations import RelationSpec
from ..ops import BINARY_POINTWISE, TERNARY_POINTWISE, UNARY_POINTWISE
from ..signature import Dims, Sig, prod
from .core import reduce_init_identities
from .values import shape_text

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("pm1", "pm2", "pm2l", "pm2r", "pm3", "pbn", "pdb", "pdc", "psum", "pcat", "padrows", "pbslice", "pbns", "pbsplit")

# f(0) = 0 exactly (and f(-0) = ±0): a zero tail stays zero. Not exp, cos, logistic, rsqrt,
# log, not, ... (their value at 0 is not 0).
ZERO_UNARY = frozenset({"negate", "convert", "copy", "abs", "sign", "sine", "tanh", "sqrt", "cbrt", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "expm1", "log-plus-one", "real"})
ZERO_BOTH = frozenset({"add", "subtract", "maximum", "minimum", "or", "xor"})
# 0·y = 0 for finite y (the float model excludes infinities and NaN; integers exactly).
ZERO_EITHER = frozenset({"multiply", "and"})


def _set(dims: Dims, d: int, v: int) -> Dims:
    return (*dims[:d], v, *dims[d + 1 :])


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None] | None:
    """None (nothing to write) when no input is padded and no gather picks a rank's own rows."""
    c = g.spec.c
    inputs, specs = _padded_inputs(g.spec, g.baseline)
    pairs = seed_pairs(inputs, g.distributed.entry.instructions, c)
    if not pairs:
        return None
    pads = PadTables(c, rows, pairs, specs)

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None:
            return
        ins = node.ins
        if node.side == "baseline":
            init = reduce_init_identities(g, node)
            pads.baseline(sig, ins, bool(init) and ins.parsed.get("reducer") in init)
        elif ins.opcode == "gather" and len(opnd) == 2:
            pick = rows_pick(ins, tuple(opnd[0].dims), tuple(opnd[1].dims), c)
            if pick is not None:
                rows["padrows"].append((key, pick[0], pick[1], shape_text(opnd[1].dtype, tuple(opnd[1].dims))))

    return visit


Block = tuple[tuple[int, int], ...]  # a padb spec: (n, w) of each block, in block order


def _padded_inputs(spec: RelationSpec, baseline: Module) -> tuple[list[tuple[int, int]], list[Block]]:
    """(n, w) of every padded input: the baseline parameter's extent along dim, the width; for
    one padded in blocks also each block's (n, w), and its blocks (padb specs)."""
    out: list[tuple[int, int]] = []
    specs: list[Block] = []
    params = {p.parameter_number: p for p in baseline.entry.parameters} | {p.name: p for p in baseline.entry.parameters}
    for b in spec.inputs:
        r = b.relation
        if r.kind == "padded" and r.width and b.baseline is not None:
            p = params.get(b.baseline if isinstance(b.baseline, int) else b.baseline.lstrip("%"))
            if p is not None and r.dim is not None and r.dim < len(p.shape.dims):
                out.append((p.shape.dims[r.dim], r.width))
                if len(r.blocks) > 1:
                    specs.append(tuple(zip(r.blocks, r.widths, strict=True)))
                    out.extend(zip(r.blocks, r.widths, strict=True))
    return out, specs


def spec_text(blocks: Block) -> str:
    """rules/padded.egg's padb spec string, as relations.Relation.padded_spec writes it."""
    return ",".join(f"{n}:{w}" for n, w in blocks)


class PadTables:
    def __init__(self, c: int, rows: Rows, pairs: set[tuple[int, int]], specs: list[Block] | None = None) -> None:
        self.rows = rows
        self.c = c
        # baseline extent n -> per-rank widths w (c·w >= n)
        self.widths: dict[int, set[int]] = {}
        for n, w in pairs:
            self.note(n, w)
        # baseline extent n -> the block specs of that total (padded in blocks, padb)
        self.specs: dict[int, set[Block]] = {}
        for blocks in specs or ():
            self.specs.setdefault(sum(n for n, _ in blocks), set()).add(blocks)

    def add(self, table: str, *row: object) -> None:
        self.rows[table].append(row)

    def note(self, n: int, w: int) -> None:
        if n > 0 and w > 0 and self.c * w >= n:
            self.widths.setdefault(n, set()).add(w)

    def _splits(self, n: int, t: int) -> bool:
        """Whether a split of the padded extent n into (n/T, T, ...) keeps the layout (GroupTables
        narrows it to T dividing each group's extent)."""
        return True

    def _ws(self, n: int) -> list[int]:
        return sorted(self.widths.get(n, ()))

    def baseline(self, sig: Sig, ins: Instruction, init_identity: bool) -> None:
        op, k, add = sig.opcode, sig.key(), self.add
        ins_dims = [d for _, d in sig.ins]
        out = sig.out[1]
        if not self.widths:
            return
        if op in UNARY_POINTWISE and len(ins_dims) == 1 and ins_dims[0] == out:
            zk = 1 if op in ZERO_UNARY else 0
            for d, n in enumerate(out):
                for w in self._ws(n):
                    s = _set(out, d, w)
                    add("pm1", k, d, w, d, w, zk, sig.with_dims([s], s).key())
        elif op in BINARY_POINTWISE and len(ins_dims) == 2 and ins_dims[0] == ins_dims[1] == out:
            zr = "both" if op in ZERO_BOTH else "either" if op in ZERO_EITHER else "none"
            for d, n in enumerate(out):
                for w in self._ws(n):
                    s = _set(out, d, w)
                    add("pm2", k, d, w, zr, sig.with_dims([s, s], s).key())
        elif op in TERNARY_POINTWISE and all(x == out for x in ins_dims):
            for d, n in enumerate(out):
                for w in self._ws(n):
                    s = _set(out, d, w)
                    add("pm3", k, d, w, sig.with_dims([s] * len(ins_dims), s).key())
        elif op == "transpose":
            perm = list(ins.parsed.get("dimensions", []))
            src = ins_dims[0]
            for e, d in enumerate(perm):
                for w in self._ws(src[d]):
                    add("pm1", k, d, w, e, w, 1, sig.with_dims([_set(src, d, w)], _set(out, e, w)).key())
        elif op == "broadcast":
            self._broadcast(sig, ins, ins_dims[0], out)
        elif op == "reshape":
            self._reshape(sig, ins_dims[0], out)
            if self.specs:
                self._block_split(sig, ins_dims[0], out)
        elif op == "slice":
            sl = [tuple(x) for x in ins.parsed.get("slice", [])]
            src = ins_dims[0]
            if len(sl) == len(src):
                for d, n in enumerate(src):
                    if sl[d] != (0, n, 1):
                        continue
                    for w in self._ws(n):
                        new = list(sl)
                        new[d] = (0, w, 1)
                        add("pm1", k, d, w, d, w, 1, sig.with_dims([_set(src, d, w)], _set(out, d, w), slice=new).key())
                if self.specs:
                    self._block_slice(sig, sl, src, out)
        elif op == "reduce" and len(ins_dims) == 2:
            dims = sorted(ins.parsed.get("dimensions", []))
            reducer = ins.parsed.get("reducer")
            zk = 1 if init_identity and reducer in ("add", "max", "min") else 0
            src = ins_dims[0]
            for d, n in enumerate(src):
                for w in self._ws(n):
                    si = _set(src, d, w)
                    if d in dims:
                        if dims == [d] and reducer == "add" and init_identity:
                            add("psum", k, d, w, sig.with_dims([si, ins_dims[1]]).key())
                        continue
                    e = d - sum(1 for x in dims if x < d)
                    add("pm2l", k, d, w, e, w, zk, sig.with_dims([si, ins_dims[1]], _set(out, e, w)).key())
        elif op == "dot" and len(ins_dims) == 2:
            self._dot(sig, ins, ins_dims, out)
        elif op == "concatenate":
            cat = (ins.parsed.get("dimensions") or [0])[0]
            for d, n in enumerate(out):
                if d == cat or any(x[d] != n for x in ins_dims):
                    continue
                for w in self._ws(n):
                    add("pcat", k, d, w, sig.with_dims([_set(x, d, w) for x in ins_dims], _set(out, d, w)).key())

    def _broadcast(self, sig: Sig, ins: Instruction, src: Dims, out: Dims) -> None:
        k, add = sig.key(), self.add
        dims = list(ins.parsed.get("dimensions", []))
        if len(dims) != len(src):
            return
        for d, e in enumerate(dims):
            if src[d] != out[e]:
                continue
            for w in self._ws(src[d]):
                add("pm1", k, d, w, e, w, 1, sig.with_dims([_set(src, d, w)], _set(out, e, w)).key())
        # A dim the broadcast creates (or expands from extent 1) holds the same values at every
        # index: per rank, the same broadcast into w elements there.
        for e, n in enumerate(out):
            if e in dims and src[dims.index(e)] != 1:
                continue
            for w in self._ws(n):
                add("pbn", k, e, w, sig.with_dims(None, _set(out, e, w)).key())
            for blocks in self.specs.get(n, ()):
                w = sum(x for _, x in blocks)
                add("pbns", k, e, w, spec_text(blocks), sig.with_dims(None, _set(out, e, w)).key())

    def _block_split(self, sig: Sig, src: Dims, out: Dims) -> None:
        """pbsplit(k, d, W, spec, e, w', kp): reshape k splits dim d, m equal blocks of n (spec
        "n:w" m times), into (m, n/T, T...) at dims e, e + 1, ... (timm's
        ``qkv.reshape(B, N, 3, heads, hd)``): dim e picks the block and is whole on the ranks
        (m), dim e + 1 holds the block's n/T rows padded to c·w/T (T the product of the dims
        after it, dividing n and w)."""
        for d, n in enumerate(src):
            for blocks in self.specs.get(n, ()):
                nb, wb = blocks[0]
                m = len(blocks)
                if any(b != (nb, wb) for b in blocks) or m < 2:
                    continue
                before = prod(src[:d])
                for e in range(len(out) - 1):
                    if prod(out[:e]) != before or out[e] != m:
                        continue
                    for f in range(e + 2, len(out) + 1):
                        if prod(out[e + 1 : f]) != nb:
                            continue
                        t = prod(out[e + 2 : f])
                        if nb % t or wb % t:
                            continue
                        self.note(nb // t, wb // t)
                        kp = sig.with_dims([_set(src, d, m * wb)], _set(out, e + 1, wb // t)).key()
                        self.add("pbsplit", sig.key(), d, m * wb, spec_text(blocks), e + 1, wb // t, kp)

    def _block_slice(self, sig: Sig, sl: list[tuple[int, ...]], src: Dims, out: Dims) -> None:
        """pbslice(k, d, W, spec, w_i, full, kp): slice k takes exactly block i of dim d of a tensor
        padded in blocks (spec: (n, w) of each block; baseline [o_i, o_i + n_i), stride 1),
        and kp takes that block's per-rank piece [O_i, O_i + w_i) out of the W = sum(w) there
        (O_i the widths of the blocks before it); full = 1 when c·w_i = n_i (the block has no
        padding, so no tail). Every other dim is sliced alike."""
        for d, n in enumerate(src):
            for blocks in self.specs.get(n, ()):
                total = sum(w for _, w in blocks)
                o = oo = 0
                for nb, wb in blocks:
                    if tuple(sl[d]) == (o, o + nb, 1):
                        new = list(sl)
                        new[d] = (oo, oo + wb, 1)
                        full = 1 if self.c * wb == nb else 0  # no padding in this block: no tail
                        self.add("pbslice", sig.key(), d, total, spec_text(blocks), wb, full, sig.with_dims([_set(src, d, total)], _set(out, d, wb), slice=new).key())
                    o, oo = o + nb, oo + wb

    def _reshape(self, sig: Sig, src: Dims, out: Dims) -> None:
        """Rank r's block [r·w, r·w + w) of dim d is a block of the reshaped dim when d maps
        whole onto a dim (same extent, same element count before it), when d splits into
        (n/T, T, ...) with T dividing w (the block is whole rows of the trailing dims, and the
        padding past n is past n/T), or when d leads a run of dims merged into one (T the
        product of the rest: block [r·w·T, (r + 1)·w·T), padding past n·T)."""
        k, add = sig.key(), self.add
        for d, n in enumerate(src):
            ws = self._ws(n)
            if not ws:
                continue
            before = prod(src[:d])
            for e in range(len(out)):
                if prod(out[:e]) != before:
                    continue
                if out[e] == n:
                    for w in ws:
                        add("pm1", k, d, w, e, w, 1, sig.with_dims([_set(src, d, w)], _set(out, e, w)).key())
                    continue
                # split: out[e:f] multiplies to n
                for f in range(e + 2, len(out) + 1):
                    if prod(out[e:f]) == n:
                        t = prod(out[e + 1 : f])
                        for w in ws:
                            if w % t == 0 and self._splits(n, t):
                                self.note(n // t, w // t)
                                add("pm1", k, d, w, e, w // t, 1, sig.with_dims([_set(src, d, w)], _set(out, e, w // t)).key())
                # merge: src[d:f] multiplies to out[e]
                for f in range(d + 2, len(src) + 1):
                    if prod(src[d:f]) == out[e]:
                        t = prod(src[d + 1 : f])
                        for w in ws:
                            self.note(n * t, w * t)
                            add("pm1", k, d, w, e, w * t, 1, sig.with_dims([_set(src, d, w)], _set(out, e, w * t)).key())

    def _dot(self, sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims) -> None:
        k, add = sig.key(), self.add
        p = ins.parsed
        lb, rb = list(p.get("lhs_batch_dims", [])), list(p.get("rhs_batch_dims", []))
        lc, rc = list(p.get("lhs_contracting_dims", [])), list(p.get("rhs_contracting_dims", []))
        lhs, rhs = ins_dims
        lfree = [x for x in range(len(lhs)) if x not in lb and x not in lc]
        rfree = [x for x in range(len(rhs)) if x not in rb and x not in rc]
        for i, (dl, dr) in enumerate(zip(lb, rb, strict=False)):
            if lhs[dl] == rhs[dr]:
                for w in self._ws(lhs[dl]):
                    add("pdb", k, dl, dr, w, i, sig.with_dims([_set(lhs, dl, w), _set(rhs, dr, w)], _set(out, i, w)).key())
        for j, dl in enumerate(lfree):
            e = len(lb) + j
            for w in self._ws(lhs[dl]):
                add("pm2l", k, dl, w, e, w, 1, sig.with_dims([_set(lhs, dl, w), rhs], _set(out, e, w)).key())
        for j, dr in enumerate(rfree):
            e = len(lb) + len(lfree) + j
            for w in self._ws(rhs[dr]):
                add("pm2r", k, dr, w, e, w, 1, sig.with_dims([lhs, _set(rhs, dr, w)], _set(out, e, w)).key())
        for dl, dr in zip(lc, rc, strict=False):
            if lhs[dl] == rhs[dr]:
                for w in self._ws(lhs[dl]):
                    add("pdc", k, dl, dr, w, sig.with_dims([_set(lhs, dl, w), _set(rhs, dr, w)], out).key())


def rows_pick(ins: Instruction, src: Dims, idx: Dims, c: int) -> tuple[int, int] | None:
    """(d, w) when distributed gather ``ins`` is index_select along d of w rows (kept in place)
    out of an operand with n <= c·w rows there: a rank's own rows of a padded layout."""
    p = ins.parsed
    collapsed = list(p.get("collapsed_slice_dims", []))
    if ins.opcode != "gather" or len(idx) != 1 or p.get("index_vector_dim") != 1 or len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
        return None
    d, w = collapsed[0], idx[0]
    if not 0 <= d < len(src) or not 0 < src[d] <= c * w:
        return None
    if list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
        return None
    if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or tuple(ins.shape.dims) != tuple(w if i == d else n for i, n in enumerate(src)):
        return None
    if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
        return None
    return d, w


def seed_pairs(padded_inputs: list[tuple[int, int]], distributed: list[Instruction], c: int) -> set[tuple[int, int]]:
    """The (n, w) pairs to start from: padded inputs (baseline extent, width) and the rank's
    own-rows gathers of the distributed program."""
    pairs = set(padded_inputs)
    shapes = {i.name: tuple(i.shape.dims) for i in distributed}
    for ins in distributed:
        if ins.opcode == "gather" and len(ins.operands) == 2:
            src, idx = shapes.get(ins.operands[0]), shapes.get(ins.operands[1])
            if src is not None and idx is not None:
                found = rows_pick(ins, src, idx, c)
                if found is not None:
                    pairs.add((src[found[0]], found[1]))
    return pairs
