"""Family core (rules/core.egg): the shape arithmetic the rules consult, facts about single
signatures, never about relations. Its rows also serve the shape laws of partition.egg,
collectives.egg, layout.egg (ubcast, bcastunit), customcall.egg, permute.egg, alltoall.egg,
ring.egg, window.egg (reverse, reduce-window, mirrored permutes) and slicing.egg (grp: GroupTables).

The laws live in ``rules/*.egg``; a law such as "a pointwise map commutes with block sharding"
needs to know, for a given baseline signature, which input dimension becomes which output
dimension and what the per-rank signature is. Those are pure functions of one signature and the
group size ``c``, computed here once per distinct signature and loaded as TSV tables:

``moves1(k, d, e, kp)``      unary k sends block-sharding on input dim d to output dim e;
                             kp is its per-rank signature (any block order along d survives).
``moves1p(k, d, e, kp)``     the same, but only for plain (contiguous) sharding (reshape, slice).
``bcastnew(k, e, kp)``       broadcast k creates output dim e; kp broadcasts into e/c.
``bcastblocks(k, e, spec, kp)`` the same for a fused dim e of those block sizes (constant
                             along e, so every piece of every block is the same broadcast).
``bcastunit(k, e)``          block r along e of broadcast k is a reshape of its operand (see
                             unit_block_broadcast); ``bcastexpand(k, e)``: and it has the
                             operand's shape (the broadcast only expands a unit dim e to c).
``moves2(k, dl, dr, e, kp)`` binary k: both operands sharded (dl, dr) give output sharded e.
``moves2l(k, d, e, kp)``     binary k: lhs sharded d, rhs identical on all ranks, output e.
``moves2r(k, d, e, kp)``     binary k: rhs sharded d, lhs identical on all ranks, output e.
``moves3(k, d, kp)``         pointwise ternary: all operands sharded d.
``contracts(k, dl, dr, kp)`` dot k sums over lhs dim dl paired with rhs dim dr.
``reduces(k, d, op, kp)``    reduce k folds input dim d with reducer op (identity init).
``lin1(k, op)``              unary k commutes with reducing over ranks by op.
``lin2(k, op)``              binary k: op-partials in both operands give an op-partial.
``lin2l(k, op)``/``lin2r``   binary k: op-partial in lhs (rhs) and a duplicate other operand.
``catblocks(k, d, spec, kp)`` concatenate k along d of operands whose sizes are spec.
``blockslice(k, d, spec, kp)`` slice k takes exactly one block of the fused dim d (spec
                             lists the block sizes); kp takes that block's per-rank part.
``padblock(k, d, spec, kp)`` pad k puts its operand exactly at one block of the fused dim
                             d; kp puts that block's per-rank part at its per-rank offset.
``mergeblocks(k, d, e, spec, kp)`` reshape k merges a run of dims ending in d into dim e:
                             contiguous sharding along d becomes fused-block sharding of e with
                             block sizes spec (merged_blocks); kp is the per-rank reshape.
``mergerun(k, d, e, spec, kp)``   the same for a merge that also carries the whole dims after d
                             along (merged_run_blocks: GQA's repeated KV heads).
``splitblocks(k, e, spec, d, kp)`` the inverse: reshape k splits e (fused, spec) so that each
                             block becomes dim d; the sharding becomes contiguous along d.
``ubcast(L, K, kb, kd, K2)`` baseline broadcast kb and distributed broadcast kd of tensors related
                             by layout L and kind K, where L only inserts or removes unit
                             dims: the results relate plainly by K2 (unit_reshape_broadcasts).
``allreduce(k, op)``, ``allgather(k, d)``, ``reducescatter(k, d, op)``: collectives over the
                             sharding group (dist signatures only).
``alltoall(k, t, L, K)``     array all-to-all k of a tensor sharded along t: layout L, kind K
                             (alltoall_layouts).
``alltoalldim(k, s)``        k is an array all-to-all along dim s (split count c, the extent of
                             s divisible by c) over the sharding groups in order.
``permuteall(k)``            collective-permute k sends within each group (permute_within_groups)
                             and every rank of every group receives exactly once.
``cpshift(k, m)``           collective-permute k shifts every group's ring by m (ring_shift).
``cpmirror(k)``              collective-permute k sends group[i] to group[c-1-i] in every group
                             (rules/window.egg, the mirrored block).
``revflips(k, d, kp)``       reverse k reverses dim d (divisible by c); kp its per-rank
                             signature (rules/window.egg, reverse along the sharded dim).
``dotfree2(k, dl, dr, el, er, kp)`` dot k keeps lhs free dim dl as output dim el and rhs free
                             dim dr as er; kp has both blocked (rules/ring.egg, 2-D blocks).
``moves1x2(k, da, ea, db, eb, kp)`` unary k sends blocks along input dims da and db (at once)
                             to output dims ea and eb; kp has both blocked (rules/ring.egg).
``reduces2(k, db, da, ea, op, kp)`` reduce k folds dim db alone with op; dim da survives as
                             ea; kp has da and db blocked (rules/ring.egg).
``moves2x2(k, da, db, kp)``   binary pointwise k with both operands blocked along da and db.
``bcast2(k, ea, da, db, kp)`` broadcast k repeats its operand along a new dim db, keeping the
                             operand's dims in order; operand dim ea is da; kp has ea blocked
                             in, da and db blocked out (rules/ring.egg).
``dotc2(k, dl, dr, da, ea, kp)`` dot k contracts lhs dl with rhs dr (its only contracting pair)
                             and keeps lhs free dim da as ea; kp has dl, dr, da blocked.
``dotrows(k, dl)``           dot k contracts lhs dim dl alone and its result starts with the
                             other lhs dims in their order (batch dims first, then free dims).
``ccident(k)``, ``ccmoves(k, d, kp)``: custom-calls as the relations file declares them
                             (Tables.custom_call).

Side conditions each row carries (audit, issue 23): shape rows (moves*, blocks, reshapes) only
move values and hold for every dtype; ``lin*`` rows name the reduction over ranks an op commutes
with, per element type: add for negate/copy/layouts and integer add/subtract/multiply (exact
modulo 2^bits, narrow and unsigned ints included), float divide only (integer division
truncates); max/min only for monotone maps (ops.monotone_convert: no int->int convert that can
wrap) and, for add/subtract of a duplicate, floats only (integer adds wrap; rules/slicing.egg
decides them by ranges). Collective rows only for collectives over the sharding groups
(graph._groups_ok: all-reduce as sets, the others in order) and permutes whose pairs stay
inside one group (permute_within_groups).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ...ir import Instruction, Module, Shape
from ...relations import CustomCallRule
from ..bijection import Layout
from ..ops import (
    BINARY_POINTWISE,
    COLLECTIVES,
    FLOAT_TYPES,
    MONOTONE,
    TERNARY_POINTWISE,
    UNARY_POINTWISE,
    monotone_convert,
)
from ..scatter import scatter_group_factors
from ..signature import Dims, Sig, gscale, prod, scale
from .values import (
    divides_by_literal_zero,
    finite_extremes,
    identity_of,
    index_select_dim,
    scalar_of,
)

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Row = tuple[object, ...]
Rows = dict[str, list[Row]]

TABLES = (
    "moves1", "moves1p", "bcastnew", "bcastblocks", "bcastunit", "bcastexpand", "moves2", "moves2l", "moves2r", "moves3",
    "contracts", "reduces", "lin1", "lin2", "lin2l", "lin2r", "catmoves", "catblocks", "blockslice", "padblock", "dsmoves", "dusmoves",
    "mergeblocks", "mergerun", "splitblocks", "ubcast", "allreduce", "allgather", "reducescatter", "alltoall", "alltoalldim",
    "permuteall", "cpshift", "cpmirror", "revmoves", "revflips", "winmoves", "dotfree2", "moves1x2", "reduces2", "moves2x2", "bcast2",
    "dotc2", "dotrows", "ccident", "ccmoves", "gm1", "gm2", "gm2l", "gm3", "gdot", "gbnew", "gsplit", "gmerge", "gcat",
)  # fmt: skip


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None]:
    """The shape rows of every signature of both graphs (Tables, GroupTables)."""
    spec = g.spec
    tables = Tables(spec.c, rows)
    groups = GroupTables(tables, set(group_factors(g)))
    block_specs = _block_specs(g)
    tables.divide_linear = not divides_by_literal_zero(g)

    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is None:
            return
        ins, side = node.ins, node.side
        if ins.opcode == "custom-call" and ins.parsed.get("custom_call_target") in spec.custom_calls:
            tables.custom_call(sig, spec.custom_calls[ins.parsed["custom_call_target"]], side == "baseline")
        if ins.opcode == "broadcast":
            tables.unit_broadcast(sig, ins, side == "baseline")  # rules/layout.egg ubcast
        if side == "baseline":
            tables.baseline(sig, ins, reduce_init_identities(g, node), block_specs)
            if groups.factors:
                groups.baseline(sig, ins, [d for _, d in sig.ins], sig.out[1])
        elif ins.opcode == "collective-permute":
            tables.permute(sig, ins, spec.groups)
        elif ins.opcode in COLLECTIVES:
            # make_sig marks a collective over the sharding groups (graph._groups_ok) with "G".
            tables.distributed(sig, ins, dict(sig.attrs).get("groups") == "G")

    return visit


def reduce_init_identities(g: Graphs, node: Node) -> list[str]:
    """The reducers a reduce's init literal is an identity of (its exact value compared)."""
    if node.ins.opcode != "reduce" or len(node.operands) != 2:
        return []
    init = g.nodes[node.operands[1]].ins
    return identity_of(init, scalar_of(init), finite_extremes(g))


def group_factors(g: Graphs) -> list[int]:
    """Group factors K (1 < K < c, dividing c) of the distributed graph's rank-indexed
    index_selects and their backward scatters: the rank-group relation's tables are written only
    for these (memo on g, several families read them)."""
    got = g.memo.get("group_factors")
    if got is None:
        c = g.spec.c
        got = g.memo["group_factors"] = sorted(k for k in _group_factors(g.distributed, c) if 1 < k < c and c % k == 0)
    return got  # type: ignore[return-value]


def _group_factors(distributed: Module, c: int) -> set[int]:
    """K = c/n for the index_selects of n elements in the distributed graph."""
    comp = distributed.entry
    out = set()
    for ins in comp.instructions:
        if ins.opcode == "scatter":
            # Their backward (index_add of one element, rules/scatter.egg) may sit in a segment
            # of its own, without the index_select.
            out |= scatter_group_factors(ins, [x.shape for x in (comp.get(o) for o in ins.operands) if x is not None], c)
        if ins.opcode != "gather" or len(ins.operands) != 2:
            continue
        src, idx = (comp.get(o) for o in ins.operands)
        if src is None or idx is None:
            continue
        d = index_select_dim(ins, src.shape.dims, idx.shape.dims)
        if d is not None and src.shape.dims[d] and c % src.shape.dims[d] == 0:
            out.add(c // src.shape.dims[d])
    return out


def _block_specs(g: Graphs) -> set[tuple[int, ...]]:
    """Block specs of fused dims: the relations file's, and those made by merging a duplicate
    dim with a sharded one (rules/partition.egg, merge-blocks): constants broadcast into them
    need the same block spec."""
    c = g.spec.c
    specs = {b.relation.blocks for b in g.spec.inputs if b.relation.blocks}
    for ins in g.baseline.entry.instructions:
        if ins.opcode == "reshape" and ins.operands:
            src = g.baseline.entry.get(ins.operands[0])
            if src is not None:
                specs.update(b for _d, _e, b in merged_blocks(tuple(src.shape.dims), tuple(ins.shape.dims), c))
                specs.update(b for _d, _e, b in merged_run_blocks(tuple(src.shape.dims), tuple(ins.shape.dims), c))
    return specs


class Tables:
    """Rows of one graph build, written into its ``rows`` (deduplicated when build ends)."""

    def __init__(self, c: int, rows: Rows) -> None:
        self.c = c
        self.rows = rows
        # broadcast signatures seen per side (True: baseline), paired by unit_broadcast
        self.bcasts: dict[bool, dict[str, tuple[Sig, list[int]]]] = {True: {}, False: {}}
        # (sum_r a_r) / b = sum_r (a_r / b) only where no divisor is a literal 0 (values.divides_by_literal_zero)
        self.divide_linear = True

    def add(self, table: str, *row: object) -> None:
        self.rows[table].append(row)

    # -- baseline signatures -------------------------------------------------------------------
    def baseline(self, sig: Sig, ins: Instruction, init_identities: Iterable[str] = (), block_specs: Iterable[tuple[int, ...]] = ()) -> None:
        """``init_identities``: the reducers a reduce's init literal is an identity of (its
        exact value compared, values.identity_of)."""
        op, c = sig.opcode, self.c
        k = sig.key()
        ins_dims = [d for _, d in sig.ins]
        out = sig.out[1]
        if op in UNARY_POINTWISE:
            for d in range(len(out)):
                s = scale(out, d, c)
                if s:
                    self.add("moves1", k, d, d, sig.with_dims([s], s).key())
            self._moves1x2(sig, k, [(d, d) for d in range(len(out))], out, out)
            if op in ("negate", "copy"):
                self.add("lin1", k, "add")
            if op in MONOTONE or (op == "convert" and monotone_convert(sig.ins[0][0], sig.out[0])):
                self.add("lin1", k, "max")
                self.add("lin1", k, "min")
        elif op in BINARY_POINTWISE:
            for d in range(len(out)):
                s = scale(out, d, c)
                if s:
                    self.add("moves2", k, d, d, d, sig.with_dims([s, s], s).key())
            for da in range(len(out)):
                for db in range(len(out)):
                    s2 = scale(out, da, c)
                    s2 = s2 and da != db and scale(s2, db, c)
                    if s2:
                        self.add("moves2x2", k, da, db, sig.with_dims([s2, s2], s2).key())
            if op in ("add", "subtract"):
                self.add("lin2", k, "add")
            if op == "multiply":
                self.add("lin2l", k, "add")
                self.add("lin2r", k, "add")
            if op == "divide" and sig.out[0] in ("f16", "bf16", "f32", "f64") and self.divide_linear:
                # (sum_r a_r) / b = sum_r (a_r / b) in real arithmetic, the floats' model; not
                # for integers, whose division truncates ((1 + 1) / 2 = 1, 1/2 + 1/2 = 0) and
                # gives -1 for x / 0 on every rank (found by the mutation campaign). Nor where a
                # divisor is a literal 0: each rank's a_r / 0 is an infinity of a_r's sign, and
                # +inf + -inf is NaN where the baseline has one infinity (review r4).
                self.add("lin2l", k, "add")
            if op == "maximum":
                self.add("lin2", k, "max")
                self.add("lin2l", k, "max")
                self.add("lin2r", k, "max")
            if op == "minimum":
                self.add("lin2", k, "min")
                self.add("lin2l", k, "min")
                self.add("lin2r", k, "min")
            if op in ("add", "subtract") and sig.out[0] in FLOAT_TYPES:
                # max_r(a_r ± b) = max_r(a_r) ± b for b identical on every rank: rounding is
                # monotone, so this holds for floats exactly (NaN aside). Not for integers: the
                # add wraps (max(1, -1) + INT_MAX wraps, max(1 + INT_MAX, -1 + INT_MAX) does
                # not); rules/partition.egg moves integer partials only where ranges say no
                # add can wrap (p-int-bl/p-int-br, table intlin).
                self.add("lin2l", k, "max")
                self.add("lin2l", k, "min")
                if op == "add":
                    self.add("lin2r", k, "max")
                    self.add("lin2r", k, "min")
        elif op in TERNARY_POINTWISE:
            for d in range(len(out)):
                s = scale(out, d, c)
                if s:
                    shapes = [s if len(x) == len(out) else x for x in ins_dims]
                    if all(len(x) == len(out) for x in ins_dims):
                        self.add("moves3", k, d, sig.with_dims(shapes, s).key())
        elif op == "transpose":
            perm = list(ins.parsed.get("dimensions", []))
            src = ins_dims[0]
            for e, d in enumerate(perm):
                si, so = scale(src, d, c), scale(out, e, c)
                if si and so:
                    self.add("moves1", k, d, e, sig.with_dims([si], so).key())
            self._moves1x2(sig, k, [(d, e) for e, d in enumerate(perm)], src, out)
            self.add("lin1", k, "add")
            self.add("lin1", k, "max")
            self.add("lin1", k, "min")
        elif op == "broadcast":
            dims = list(ins.parsed.get("dimensions", []))
            src = ins_dims[0]
            for d, e in enumerate(dims):
                si, so = scale(src, d, c), scale(out, e, c)
                if si and so:
                    self.add("moves1", k, d, e, sig.with_dims([si], so).key())
            # Only the broadcast that repeats its operand along one new dim db, keeping the
            # operand's dims in order (a row value repeated along the keys): a broadcast that
            # also permutes the other dims would pair a row with another row's value.
            for ea, da in enumerate(dims):
                for db in range(len(out)):
                    si, so = scale(src, ea, c), scale(out, da, c)
                    so = so and dims == [x for x in range(len(out)) if x != db] and scale(so, db, c)
                    if si and so:
                        self.add("bcast2", k, ea, da, db, sig.with_dims([si], so).key())
            for e in range(len(out)):
                if e not in dims:
                    so = scale(out, e, c)
                    if so:
                        self.add("bcastnew", k, e, sig.with_dims(None, so).key())
                        for spec in block_specs:
                            if sum(spec) == out[e] and all(b % c == 0 and b > 0 for b in spec):
                                self.add("bcastblocks", k, e, ",".join(map(str, spec)), sig.with_dims(None, so).key())
            e = unit_block_broadcast(src, out, dims, c)
            if e is not None:
                self.add("bcastunit", k, e)
                if (*out[:e], 1, *out[e + 1 :]) == src:
                    self.add("bcastexpand", k, e)
            for o in ("add", "max", "min"):
                self.add("lin1", k, o)
        elif op == "reshape":
            self._reshape(sig, k, ins_dims[0], out)
            for o in ("add", "max", "min"):
                self.add("lin1", k, o)
        elif op == "slice":
            self._slice(sig, k, ins, ins_dims[0], out, block_specs)
            for o in ("add", "max", "min"):
                self.add("lin1", k, o)
        elif op == "reduce" and len(ins_dims) == 2:
            self._reduce(sig, k, ins, ins_dims[0], out, tuple(init_identities))
        elif op == "dot":
            self._dot(sig, k, ins, ins_dims, out)
        elif op == "pad":
            pads = ins.parsed.get("padding", [])
            for d in range(len(out)):
                if d < len(pads) and tuple(pads[d]) == (0, 0, 0):
                    si, so = scale(ins_dims[0], d, c), scale(out, d, c)
                    if si and so:
                        self.add("moves2l", k, d, d, sig.with_dims([si, ins_dims[1]], so).key())
            self._pad_block(sig, k, [tuple(x) for x in pads], ins_dims[0], out, block_specs)
        elif op == "gather":
            self._gather(sig, k, ins, ins_dims, out)
        elif op in ("reverse", "reduce-window"):
            self._window(sig, k, ins, ins_dims, out)
        elif op == "concatenate":
            cat = (ins.parsed.get("dimensions") or [0])[0]
            sizes = [x[cat] for x in ins_dims]
            if len(sizes) > 1 and all(n % c == 0 for n in sizes):
                self.add("catblocks", k, cat, ",".join(map(str, sizes)), sig.with_dims([scale(x, cat, c) or x for x in ins_dims], scale(out, cat, c)).key())
            for d in range(len(out)):
                if d != cat and all(x[d] == out[d] for x in ins_dims):
                    so = scale(out, d, c)
                    if so:
                        self.add("catmoves", k, d, sig.with_dims([scale(x, d, c) or x for x in ins_dims], so).key())
        elif op == "dynamic-slice":
            sizes = list(ins.parsed.get("dynamic_slice_sizes", []))
            for d in range(len(out)):
                if d < len(sizes) and sizes[d] == ins_dims[0][d]:
                    si, so = scale(ins_dims[0], d, c), scale(out, d, c)
                    if si and so:
                        new_sizes = list(sizes)
                        new_sizes[d] = si[d]
                        self.add("dsmoves", k, d, sig.with_dims([si, *ins_dims[1:]], so, dynamic_slice_sizes=new_sizes).key())
        elif op == "dynamic-update-slice" and len(ins_dims) >= 2:
            for d in range(len(out)):
                if ins_dims[1][d] == ins_dims[0][d]:
                    si, su = scale(ins_dims[0], d, c), scale(ins_dims[1], d, c)
                    if si and su:
                        self.add("dusmoves", k, d, sig.with_dims([si, su, *ins_dims[2:]], si).key())

    def _moves1x2(self, sig: Sig, k: str, pairs: list[tuple[int, int]], src: Dims, out: Dims) -> None:
        """moves1x2 rows for unary k: every two (input dim -> output dim) pairs it maps whole."""
        c = self.c
        for da, ea in pairs:
            for db, eb in pairs:
                if da == db or ea == eb:
                    continue
                si, so = scale(src, da, c), scale(out, ea, c)
                si, so = si and scale(si, db, c), so and scale(so, eb, c)
                if si and so:
                    self.add("moves1x2", k, da, ea, db, eb, sig.with_dims([si], so).key())

    def _reshape(self, sig: Sig, k: str, src: Dims, out: Dims) -> None:
        # Block r along d of x is the contiguous run of flat indices
        # [a*T + r*T/c, a*T + (r+1)*T/c) for T = prod(src[d:]); it is block r along e of the
        # reshaped tensor iff the prefixes before d and e hold the same number of elements.
        # When dim d maps whole onto dim e (only other dims are split or merged), any block
        # order along d survives too, so fused-block sharding passes (moves1, not moves1p).
        c = self.c
        for d in range(len(src)):
            for e in range(len(out)):
                if prod(src[:d]) == prod(out[:e]) and src[d] % c == 0 and out[e] % c == 0:
                    si, so = scale(src, d, c), scale(out, e, c)
                    if si and so:
                        table = "moves1" if src[d] == out[e] else "moves1p"
                        self.add(table, k, d, e, sig.with_dims([si], so).key())
        # Two dims that each map whole (same extent, same number of elements before them):
        # the elements between and around them are reshaped among themselves, so the (i, j)
        # block along both is the per-rank reshape of the (i, j) block.
        whole = [(d, e) for d in range(len(src)) for e in range(len(out)) if src[d] == out[e] and prod(src[:d]) == prod(out[:e])]
        self._moves1x2(sig, k, whole, src, out)
        for d, e, spec in merged_blocks(src, out, c):
            si, so = scale(src, d, c), scale(out, e, c)
            if si and so:
                self.add("mergeblocks", k, d, e, ",".join(map(str, spec)), sig.with_dims([si], so).key())
        # The same merge carrying whole dims after d along (GQA's repeated KV heads, a group's
        # query heads): rules/partition.egg merge-run-blocks.
        for d, e, spec in merged_run_blocks(src, out, c):
            si, so = scale(src, d, c), scale(out, e, c)
            if si and so:
                self.add("mergerun", k, d, e, ",".join(map(str, spec)), sig.with_dims([si], so).key())
        # The inverse: the reshape splits a fused dim of m equal blocks back into (.., m, n).
        for d, e, spec in merged_blocks(out, src, c):
            si, so = scale(src, e, c), scale(out, d, c)
            if si and so:
                self.add("splitblocks", k, e, ",".join(map(str, spec)), d, sig.with_dims([si], so).key())

    def _slice(self, sig: Sig, k: str, ins: Instruction, src: Dims, out: Dims, block_specs: Iterable[tuple[int, ...]]) -> None:
        c = self.c
        sl = [tuple(x) for x in ins.parsed.get("slice", [])]
        if len(sl) != len(src):
            return
        for d in range(len(src)):
            start, limit, stride = sl[d]
            if (start, limit, stride) == (0, src[d], 1):
                si, so = scale(src, d, c), scale(out, d, c)
                if si and so:
                    new = list(sl)
                    new[d] = (0, si[d], 1)
                    self.add("moves1p", k, d, d, sig.with_dims([si], so, slice=new).key())
            elif stride == 1:
                for spec in block_specs:
                    if sum(spec) != src[d] or any(b % c for b in spec):
                        continue
                    off = 0
                    for size in spec:
                        if (start, limit) == (off, off + size):
                            si = scale(src, d, c)
                            so = scale(out, d, c)
                            new = list(sl)
                            new[d] = (off // c, (off + size) // c, 1)
                            if si and so:
                                self.add("blockslice", k, d, ",".join(map(str, spec)), sig.with_dims([si], so, slice=new).key())
                        off += size

    def _pad_block(self, sig: Sig, k: str, pads: list[tuple[int, ...]], src: Dims, out: Dims, block_specs: Iterable[tuple[int, ...]]) -> None:
        """padblock(k, d, spec, kp): pad k puts its operand exactly at block j of a fused dim d
        (spec lists the block sizes; no other padding); kp puts the block's per-rank part at
        the block's per-rank offset (the backward of slicing a fused projection by indexing)."""
        c = self.c
        if len(pads) != len(src) or len(src) != len(out):
            return
        padded = [d for d, p in enumerate(pads) if p != (0, 0, 0)]
        if len(padded) != 1:
            return
        d = padded[0]
        lo, hi, interior = pads[d]
        if interior != 0 or lo < 0 or hi < 0:
            return
        for spec in block_specs:
            if sum(spec) != out[d] or any(b % c or b <= 0 for b in spec):
                continue
            off = 0
            for size in spec:
                if (lo, size, hi) == (off, src[d], out[d] - off - size):
                    si, so = scale(src, d, c), scale(out, d, c)
                    if si and so:
                        new = list(pads)
                        new[d] = (lo // c, hi // c, 0)
                        self.add("padblock", k, d, ",".join(map(str, spec)), sig.with_dims([si, ()], so, padding=new).key())
                off += size

    def _reduce(self, sig: Sig, k: str, ins: Instruction, src: Dims, out: Dims, init_identities: tuple[str, ...]) -> None:
        c = self.c
        dims = sorted(ins.parsed.get("dimensions", []))
        reducer = ins.parsed.get("reducer")
        identity = reducer in init_identities
        for d in range(len(src)):
            si = scale(src, d, c)
            if not si:
                continue
            if d in dims:
                if reducer in ("add", "max", "min"):
                    # the rule itself checks that both inits are identities of the reducer
                    self.add("reduces", k, d, reducer, sig.with_dims([si, sig.ins[1][1]]).key())
            else:
                e = d - sum(1 for x in dims if x < d)
                so = scale(out, e, c)
                if so:
                    self.add("moves2l", k, d, e, sig.with_dims([si, sig.ins[1][1]], so).key())
        if identity and reducer in ("add", "max", "min"):
            self.add("lin2l", k, reducer)
        if len(dims) == 1 and reducer in ("add", "max", "min"):
            db = dims[0]
            for d in range(len(src)):
                if d == db:
                    continue
                e = d - (1 if db < d else 0)
                sab, so = scale(src, d, c), scale(out, e, c)
                sab = sab and scale(sab, db, c)
                if sab and so:
                    self.add("reduces2", k, db, d, e, reducer, sig.with_dims([sab, sig.ins[1][1]], so).key())

    def _dot(self, sig: Sig, k: str, ins: Instruction, ins_dims: list[Dims], out: Dims) -> None:
        c = self.c
        lb = list(ins.parsed.get("lhs_batch_dims", []))
        rb = list(ins.parsed.get("rhs_batch_dims", []))
        lc = list(ins.parsed.get("lhs_contracting_dims", []))
        rc = list(ins.parsed.get("rhs_contracting_dims", []))
        lhs, rhs = ins_dims
        lfree = [d for d in range(len(lhs)) if d not in lb and d not in lc]
        rfree = [d for d in range(len(rhs)) if d not in rb and d not in rc]
        for i, (dl, dr) in enumerate(zip(lb, rb, strict=False)):
            sl, sr, so = scale(lhs, dl, c), scale(rhs, dr, c), scale(out, i, c)
            if sl and sr and so:
                self.add("moves2", k, dl, dr, i, sig.with_dims([sl, sr], so).key())
        for j, dl in enumerate(lfree):
            e = len(lb) + j
            sl, so = scale(lhs, dl, c), scale(out, e, c)
            if sl and so:
                self.add("moves2l", k, dl, e, sig.with_dims([sl, rhs], so).key())
        for j, dr in enumerate(rfree):
            e = len(lb) + len(lfree) + j
            sr, so = scale(rhs, dr, c), scale(out, e, c)
            if sr and so:
                self.add("moves2r", k, dr, e, sig.with_dims([lhs, sr], so).key())
        for dl, dr in zip(lc, rc, strict=False):
            sl, sr = scale(lhs, dl, c), scale(rhs, dr, c)
            if sl and sr:
                self.add("contracts", k, dl, dr, sig.with_dims([sl, sr], out).key())
        if len(lc) == 1:
            if lb + lfree == [d for d in range(len(lhs)) if d != lc[0]]:
                self.add("dotrows", k, lc[0])
            for j, da in enumerate(lfree):
                sl, sr, so = scale(lhs, lc[0], c), scale(rhs, rc[0], c), scale(out, len(lb) + j, c)
                sl = sl and scale(sl, da, c)
                if sl and sr and so:
                    self.add("dotc2", k, lc[0], rc[0], da, len(lb) + j, sig.with_dims([sl, sr], so).key())
        for j, dl in enumerate(lfree):
            for i, dr in enumerate(rfree):
                el, er = len(lb) + j, len(lb) + len(lfree) + i
                sl, sr, so = scale(lhs, dl, c), scale(rhs, dr, c), scale(out, el, c)
                so = so and scale(so, er, c)
                if sl and sr and so:
                    self.add("dotfree2", k, dl, dr, el, er, sig.with_dims([sl, sr], so).key())
        # Bilinear: sum_r dot(a_r, b) = dot(sum_r a_r, b). For integers only when the partial
        # operand has the result's type: sums modulo 2^bits agree then, but s8 pieces dotted
        # into s32 sum exactly where the baseline's s8 sum wrapped (found by review:
        # tests/soundness_regressions/s8_partial_sum_dot_widens).
        (lt, _), (rt, _) = sig.ins
        out_t = sig.out[0]
        if lt == out_t or (lt in FLOAT_TYPES and out_t in FLOAT_TYPES):
            self.add("lin2l", k, "add")
        if rt == out_t or (rt in FLOAT_TYPES and out_t in FLOAT_TYPES):
            self.add("lin2r", k, "add")

    def _gather(self, sig: Sig, k: str, ins: Instruction, ins_dims: list[Dims], out: Dims) -> None:
        c = self.c
        collapsed = set(ins.parsed.get("collapsed_slice_dims", []))
        offset_dims = list(ins.parsed.get("offset_dims", []))
        sizes = list(ins.parsed.get("slice_sizes", []))
        src = ins_dims[0]
        kept = [d for d in range(len(src)) if d not in collapsed]
        if len(kept) != len(offset_dims) or len(sizes) != len(src):
            return
        for d, e in zip(kept, offset_dims, strict=True):
            if sizes[d] != src[d]:
                continue  # only whole-extent offset dims keep block sharding
            si, so = scale(src, d, c), scale(out, e, c)
            if si and so:
                new_sizes = list(sizes)
                new_sizes[d] = si[d]
                self.add("moves2l", k, d, e, sig.with_dims([si, ins_dims[1]], so, slice_sizes=new_sizes).key())

    # -- custom-calls declared in the relations file (relations.CustomCallRule) ---------------
    def custom_call(self, sig: Sig, rule: CustomCallRule, baseline: bool) -> None:
        """``ccident(k)``: k is the identity on operand 0 (keeps: all; both graphs). For
        keeps: [duplicate, sharded] (baseline signatures), a block along any result dim d not in
        ``reduces`` is the per-rank call on the operands' blocks: operands shaped like the
        result are blocked along d, the others stay whole (moves1/moves2/moves2l/moves2r, and
        ``ccmoves(k, d, kp)`` for three or more operands with only operand 0 blocked).
        custom_call_problem has already refused calls whose shapes break these laws."""
        k, c = sig.key(), self.c
        if rule.identity:
            self.add("ccident", k)
            return
        if not baseline or "sharded" not in rule.keeps:
            return
        out = sig.out[1]
        ins_dims = [d for _, d in sig.ins]
        aligned = [x == out for x in ins_dims]
        for d in range(len(out)):
            so = scale(out, d, c)
            if d in rule.reduces or not so:
                continue
            kp = sig.with_dims([so if a else x for a, x in zip(aligned, ins_dims, strict=True)], so).key()
            if len(ins_dims) == 1:
                self.add("moves1", k, d, d, kp)
            elif len(ins_dims) == 2 and aligned == [True, True]:
                self.add("moves2", k, d, d, d, kp)
            elif len(ins_dims) == 2 and aligned == [True, False]:
                self.add("moves2l", k, d, d, kp)
            elif len(ins_dims) >= 3 and aligned[0] and not any(aligned[1:]):
                self.add("ccmoves", k, d, kp)

    # -- distributed-only signatures -----------------------------------------------------------
    def distributed(self, sig: Sig, ins: Instruction, groups_ok: bool) -> None:
        if not groups_ok:
            return
        k = sig.key()
        reducer = ins.parsed.get("reducer")
        dims = list(ins.parsed.get("dimensions", []))
        if sig.opcode == "all-reduce" and reducer in ("add", "max", "min"):
            self.add("allreduce", k, reducer)
        elif sig.opcode == "all-gather" and len(dims) == 1:
            self.add("allgather", k, dims[0])
        elif sig.opcode == "reduce-scatter" and len(dims) == 1 and reducer == "add":
            self.add("reducescatter", k, dims[0], "add")
        elif sig.opcode == "all-to-all" and len(dims) == 1 and len(sig.ins) == 1:
            for t, lkey in alltoall_layouts(sig.ins[0][1], dims[0], self.c):
                self.add("alltoall", k, t, lkey, f"s:{dims[0]}")
            if sig.ins[0][1][dims[0]] % self.c == 0:
                self.add("alltoalldim", k, dims[0])

    def unit_broadcast(self, sig: Sig, ins: Instruction, baseline: bool) -> None:
        """rules/layout.egg ``ubcast``: pair broadcast ``sig`` of one side with every broadcast
        of the other side seen so far (each pair once, whichever side comes first)."""
        if len(sig.ins) != 1:
            return
        k, dims = sig.key(), list(ins.parsed.get("dimensions", []))
        if k in self.bcasts[baseline]:
            return
        self.bcasts[baseline][k] = (sig, dims)
        for ko, (other, odims) in self.bcasts[not baseline].items():
            (kb, (bsig, bdims)), (kd, (dsig, ddims)) = ((k, (sig, dims)), (ko, (other, odims))) if baseline else ((ko, (other, odims)), (k, (sig, dims)))
            if bsig.ins[0][0] != dsig.ins[0][0] or bsig.out[0] != dsig.out[0]:
                continue
            for lkey, kind, kind2 in unit_reshape_broadcasts(bsig.ins[0][1], bsig.out[1], bdims, dsig.ins[0][1], dsig.out[1], ddims, self.c):
                self.add("ubcast", lkey, kind, kb, kd, kind2)

    def _window(self, sig: Sig, k: str, ins: Instruction, ins_dims: list[Dims], out: Dims) -> None:
        """rules/window.egg: revmoves(k, d, kp) reverse k leaves dim d in place (d not reversed);
        winmoves(k, d, kp) reduce-window k (operand, init) has a trivial window along d (size
        1, stride 1, no padding or dilation), so every index along d is computed on its own."""
        c = self.c
        if sig.opcode == "reverse" and len(ins_dims) == 1:
            rev = set(ins.parsed.get("dimensions", []))
            for d in range(len(out)):
                s = scale(out, d, c)
                if s and d not in rev:
                    self.add("revmoves", k, d, sig.with_dims([s], s).key())
                elif s:
                    self.add("revflips", k, d, sig.with_dims([s], s).key())
            for o in ("add", "max", "min"):
                self.add("lin1", k, o)  # a permutation of elements commutes with any reduction over ranks
            return
        if sig.opcode != "reduce-window" or len(ins_dims) != 2 or ins_dims[1] != () or ins_dims[0] != out:
            return
        window = ins.parsed.get("window")
        if not isinstance(window, dict):
            return
        fields: dict[str, list[str]] = {}
        for name, text in window.items():
            fields[str(name)] = str(text).split("x")
        if any(len(v) != len(out) for v in fields.values()) or set(fields) - {"size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"}:
            return
        trivial = {"size": "1", "stride": "1", "pad": "0_0", "lhs_dilate": "1", "rhs_dilate": "1", "rhs_reversal": "0"}
        for d in range(len(out)):
            s = scale(out, d, c)
            if s and all(v[d] == trivial[name] for name, v in fields.items()):
                self.add("winmoves", k, d, sig.with_dims([s, ()], s).key())

    def permute(self, sig: Sig, ins: Instruction, groups: list[list[int]]) -> None:
        """Group condition of every permute law: each pair sends within one sharding group.
        The relations hold per group (a duplicate is its own group's baseline value; data-
        parallel groups hold different data), so a pair from one group to another delivers
        another group's value, which no relation of the receiving group describes."""
        pairs = ins.parsed.get("source_target_pairs") or []
        if not permute_within_groups(pairs, groups):
            return
        targets = {t for _, t in pairs}
        if all(set(g) <= targets for g in groups) and len(targets) == len(pairs):
            self.add("permuteall", sig.key())
        if groups and len(pairs) == sum(len(g) for g in groups) and {tuple(p) for p in pairs} == {(g[i], g[len(g) - 1 - i]) for g in groups for i in range(len(g))}:
            self.add("cpmirror", sig.key())
        m = ring_shift(pairs, groups)
        if m is not None:
            self.add("cpshift", sig.key(), m)


def custom_call_problem(rule: CustomCallRule, out: tuple[str, Dims], operands: list[tuple[str, Dims]]) -> str | None:
    """Why a custom-call does not fit its declaration (its shapes make the declared law
    meaningless), or None."""
    where = f"custom-call target '{rule.target}' is declared {rule.describe()}"
    if rule.identity:
        if not operands or operands[0] != out:
            got = f"{operands[0][0]}[{','.join(map(str, operands[0][1]))}]" if operands else "no operand"
            return f"{where}, but its result {out[0]}[{','.join(map(str, out[1]))}] is not operand 0 ({got})"
        return None
    if "sharded" in rule.keeps:
        if not operands or operands[0][1] != out[1]:
            return f"{where}: expected operand 0 to have the result's dims {list(out[1])}"
        bad = [d for d in rule.reduces if d >= len(out[1])]
        if bad:
            return f"{where}, but its result has only {len(out[1])} dims (no dim {bad[0]})"
    return None


def permute_within_groups(pairs: list[list[int]] | list[tuple[int, int]], groups: list[list[int]]) -> bool:
    """Every (source, target) pair lies inside one group, and every device of a pair is in a
    group (a device outside every group runs no rank of the program)."""
    group_of = {dev: k for k, g in enumerate(groups) for dev in g}
    return all(len(p) == 2 and p[0] in group_of and group_of.get(p[0]) == group_of.get(p[1]) for p in pairs)


def ring_shift(pairs: list[list[int]] | list[tuple[int, int]], groups: list[list[int]]) -> int | None:
    """m when the (source, target) pairs are exactly the cyclic shift by m (0 < m < c) of every
    group in group order: group[i] sends to group[(i + m) mod c]. None for anything else."""
    c = len(groups[0])
    have = {tuple(p) for p in pairs}
    if len(have) != len(pairs) or c < 2:
        return None
    for m in range(1, c):
        if have == {(g[i], g[(i + m) % c]) for g in groups for i in range(c)}:
            return m
    return None


def alltoall_layouts(src: Dims, s: int, c: int) -> list[tuple[int, str]]:
    """(t, L) for an array all-to-all along dim s over the c ranks of the sharding group whose
    operand x' is block r of x along another dim t (rank r).

    The all-to-all cuts x'_r along s into c pieces and sends piece j to rank j, which
    concatenates what it receives along s in rank order: z'_j[.., (r, i)_s, ..] = x'_r[..,
    (j, i)_s, ..] = x[.., (r, a)_t, .., (j, i)_s, ..] with a the index inside t's block. So the
    layout L that splits s into (r, i) and moves r in front of t's index a turns z'_j into block j
    of x along s: layout(x, z', L, s:s), an exact re-indexing (every dtype). The producers'
    reshape/transpose/reshape after the all-to-all (torch-xla's and XLA's split/concat
    dimensions) then compose onto L in rules/layout.egg."""
    if not 0 <= s < len(src) or src[s] % c or c < 2:
        return []
    out: list[tuple[int, str]] = []
    atoms: list[int] = []
    where: dict[tuple[int, str], int] = {}  # (dim, role) -> atom index in src order
    for k, n in enumerate(src):
        if k == s:
            where[(k, "r")] = len(atoms)
            atoms.append(c)
            where[(k, "i")] = len(atoms)
            atoms.append(n // c)
        else:
            where[(k, "a")] = len(atoms)
            atoms.append(n)
    for t in range(len(src)):
        if t == s:
            continue
        perm: list[int] = []
        dst = list(src)
        for k in range(len(src)):
            if k == t:
                perm += [where[(s, "r")], where[(k, "a")]]
                dst[k] = src[k] * c
            elif k == s:
                perm.append(where[(k, "i")])
                dst[k] = src[k] // c
            else:
                perm.append(where[(k, "a")])
        try:
            layout = Layout(tuple(src), tuple(dst), tuple(atoms), tuple(perm))
        except ValueError:
            continue
        out.append((t, "id" if layout.is_identity() else layout.key()))
    return out


def merged_blocks(src: Dims, out: Dims, c: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(d, e, spec) for each way the reshape src -> out merges dims a..d of src (a < d) into one
    dim e, with the elements before and after the run in the same count on both sides.

    Then index i·n + j of e (n = src[d], i the flat index over dims a..d-1) is index (.., i, j)
    of src, so if rank r holds block r of c along d (contiguous, n/c wide), it holds the r-th
    piece of each of the m = prod(src[a:d]) blocks of size n of e: spec = (n,) * m, rank r's
    merge being the same reshape of its block. Only m > 1 (m = 1 is plain moves1)."""
    found = []
    for d in range(1, len(src)):
        n = src[d]
        if n % c or n < c:
            continue
        for a in range(d):
            m = prod(src[a:d])
            if m <= 1:
                continue
            for e in range(len(out)):
                if prod(src[:a]) == prod(out[:e]) and out[e] == m * n:
                    found.append((d, e, (n,) * m))
    return found


def merged_run_blocks(src: Dims, out: Dims, c: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(d, e, spec) for each way the reshape src -> out merges dims a..d of src (a < d) together
    with the leading factor T > 1 of the dims after d into one dim e (merged_blocks is T = 1).

    With P = prod(src[d+1:]) and Q = prod(out[e+1:]) = P / T, and the elements before a and
    before e in the same count, row-major index (i, j, u) of src (i the flat index over dims
    a..d-1, j along d of extent n, u the flat index over the dims after d) lands at index
    i·nT + j·T + floor(u/Q) of e and u mod Q after it. If rank r holds block r of c along d
    (all of u), it holds the r-th piece of each of the m = prod(src[a:d]) blocks of size nT of
    e: spec = (nT,) * m, rank r's merge being the same reshape of its block. GQA merges batch,
    KV heads and their repeat dim ([s, b, g, h/g, hd] -> [s, b·h, hd], the repeat_interleave a
    broadcast made), and a group's query heads ([s, b, g, (h/g)·hd] -> [s, b·h, hd])."""
    found = []
    for d in range(1, len(src)):
        n, p = src[d], prod(src[d + 1 :])
        if n % c or n < c:
            continue
        for a in range(d):
            m = prod(src[a:d])
            if m <= 1:
                continue
            for e in range(len(out)):
                q = prod(out[e + 1 :])
                if prod(src[:a]) != prod(out[:e]) or p % q or p == q:
                    continue
                t = p // q
                if out[e] == m * n * t:
                    found.append((d, e, (n * t,) * m))
    return found


def unit_reshape_broadcasts(bsrc: Dims, bout: Dims, bdims: list[int], dsrc: Dims, dout: Dims, ddims: list[int], c: int) -> list[tuple[str, str, str]]:
    """(L, K, K2) for which layout(x, x', L, K), z = broadcast(x) (``bsrc`` -> ``bout`` along
    ``bdims``) and z' = broadcast(x') (``dsrc`` -> ``dout`` along ``ddims``) give K2(z, z').

    K = dup: L(x') = x; K = s:d: L(x') = x's block along d, and then K2 = s:e for e = bdims[d].
    L must be the reshape of x' to that block (or to x) that only inserts or removes unit dims,
    so the two hold the same elements at the same coordinates once unit dims are dropped. The
    broadcasts agree when each non-unit dim of x' lands at the output dim where the matching
    non-unit dim of the block lands, and z' has the block's output shape. A per-rank extent of
    1 (one token per rank under sequence parallelism, one head per rank) makes such pairs: the
    rank's graph drops the unit dim the baseline keeps at its full extent."""
    if len(bdims) != len(bsrc) or len(ddims) != len(dsrc) or any(bout[e] != n for e, n in zip(bdims, bsrc, strict=True)):
        return []
    found = []
    cases: list[tuple[str, Dims | None, Dims | None, str]] = [("dup", bsrc, bout, "dup")]
    for d, e in enumerate(bdims):
        cases.append((f"s:{d}", scale(bsrc, d, c), scale(bout, e, c), f"s:{e}"))
    for kind, block, out_block, kind2 in cases:
        if block is None or out_block is None or tuple(dout) != tuple(out_block) or tuple(block) == tuple(dsrc):
            continue  # the identity layout is the plain relation: rules/partition.egg broadcasts
        bkeep = [i for i, n in enumerate(block) if n != 1]
        dkeep = [j for j, n in enumerate(dsrc) if n != 1]
        if [block[i] for i in bkeep] != [dsrc[j] for j in dkeep] or [bdims[i] for i in bkeep] != [ddims[j] for j in dkeep]:
            continue
        layout = Layout.from_chain(dsrc, [("reshape", block)])
        if layout is not None and not layout.is_identity():
            found.append((layout.key(), kind, kind2))
    return found


def unit_block_broadcast(src: Dims, out: Dims, dims: list[int], c: int) -> int | None:
    """The dim e when block r of c along e of ``broadcast(x)`` is a reshape of x: the broadcast
    keeps x's dims in order and at their sizes, except that it creates (or expands from 1) dim e
    with extent c, and any other dim it creates has extent 1. Then the per-rank broadcast
    (extent 1 along e) only inserts unit dims: it equals reshape(x), which XLA elides."""
    if len(dims) != len(src) or list(dims) != sorted(set(dims)) or c < 2:
        return None
    sharded = []
    for e, n in enumerate(out):
        if e in dims:
            s = src[dims.index(e)]
            if s == n:
                continue
            if s == 1 and n == c:
                sharded.append(e)
                continue
            return None
        if n == c:
            sharded.append(e)
        elif n != 1:
            return None
    return sharded[0] if len(sharded) == 1 else None


class GroupTables:
    """Shape arithmetic of the rank-group relation ``grp x x' d K e`` (rules/slicing.egg): rank
    r holds block floor(r/K) of q = c/K along d and, for e >= 0, block r mod K of K along e.
    Rows for the group factors K the distributed graph selects with (rank-indexed
    index_selects), for every baseline signature:

    ``gm1(k, d, K, e, d2, e2, kp)``   unary k maps grp(d, K, e) of its operand to grp(d2, K, e2)
    ``gm2(k, d, K, e, kp)``           pointwise binary, both operands grp(d, K, e)
    ``gm2l(k, d, K, e, d2, e2, kp)``  binary with a duplicate rhs (reduce init)
    ``gm3(k, d, K, e, kp)``           pointwise ternary, all operands grp(d, K, e)
    ``gdot(k, dl, el, dr, er, K, d2, e2, kp)`` dot: (dl, dr) a batch pair; el / er a free dim of
                                      one side (or a second batch pair, or both -1)
    ``gbnew(k, d, K, e, kp)``         broadcast of a duplicate that creates d (and e)
    ``gsplit(k, f, K, d, e, kp)``     reshape splitting a dim f sharded over c into (q, B, ...)
    ``gmerge(k, d, K, e, f, kp)``     reshape merging grp(d, K, d+1) with q = extent(d) back
    ``gcat(k, d, K, e, kp)``          concatenate along a dim other than d and e
    """

    def __init__(self, tables: Tables, factors: set[int]) -> None:
        self.t = tables
        self.c = tables.c
        self.factors = sorted(k for k in factors if 1 < k < tables.c and tables.c % k == 0)

    def _pairs(self, dims: Dims, k: int) -> list[tuple[int, int, Dims]]:
        out = []
        for d in range(len(dims)):
            for e in (-1, *range(len(dims))):
                s = gscale(dims, d, k, e, self.c)
                if s is not None:
                    out.append((d, e, s))
        return out

    def baseline(self, sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims) -> None:
        for k in self.factors:
            self._rows(sig, ins, ins_dims, out, k)

    def _rows(self, sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims, k: int) -> None:
        op, key, c, add = sig.opcode, sig.key(), self.c, self.t.add
        if op in UNARY_POINTWISE:
            for d, e, s in self._pairs(out, k):
                add("gm1", key, d, k, e, d, e, sig.with_dims([s], s).key())
        elif op in BINARY_POINTWISE and len(ins_dims) == 2 and ins_dims[0] == ins_dims[1] == out:
            for d, e, s in self._pairs(out, k):
                add("gm2", key, d, k, e, sig.with_dims([s, s], s).key())
        elif op in TERNARY_POINTWISE and all(x == out for x in ins_dims):
            for d, e, s in self._pairs(out, k):
                add("gm3", key, d, k, e, sig.with_dims([s, s, s], s).key())
        elif op == "transpose":
            perm = list(ins.parsed.get("dimensions", []))
            for d, e, si in self._pairs(ins_dims[0], k):
                d2, e2 = perm.index(d), perm.index(e) if e >= 0 else -1
                so = gscale(out, d2, k, e2, c)
                if so:
                    add("gm1", key, d, k, e, d2, e2, sig.with_dims([si], so).key())
        elif op == "broadcast":
            self._broadcast(sig, ins, ins_dims[0], out, k)
        elif op == "reshape":
            self._reshape(sig, ins_dims[0], out, k)
        elif op == "slice":
            sl = [tuple(x) for x in ins.parsed.get("slice", [])]
            src = ins_dims[0]
            for d, e, si in self._pairs(src, k):
                if len(sl) != len(src) or any(sl[x] != (0, src[x], 1) for x in (d, e) if x >= 0):
                    continue
                new = list(sl)
                for x in (d, e):
                    if x >= 0:
                        new[x] = (0, si[x], 1)
                so = gscale(out, d, k, e, c)
                if so:
                    add("gm1", key, d, k, e, d, e, sig.with_dims([si], so, slice=new).key())
        elif op == "reduce" and len(ins_dims) == 2:
            dims = sorted(ins.parsed.get("dimensions", []))
            for d, e, si in self._pairs(ins_dims[0], k):
                if d in dims or e in dims:
                    continue
                d2 = d - sum(1 for x in dims if x < d)
                e2 = e - sum(1 for x in dims if x < e) if e >= 0 else -1
                so = gscale(out, d2, k, e2, c)
                if so:
                    add("gm2l", key, d, k, e, d2, e2, sig.with_dims([si, ins_dims[1]], so).key())
        elif op == "dot" and len(ins_dims) == 2:
            self._dot(sig, ins, ins_dims, out, k)
        elif op == "concatenate":
            cat = (ins.parsed.get("dimensions") or [0])[0]
            for d, e, so in self._pairs(out, k):
                if cat in (d, e):
                    continue
                shapes = [gscale(x, d, k, e, c) for x in ins_dims]
                if all(shapes):
                    add("gcat", key, d, k, e, sig.with_dims(shapes, so).key())

    def _broadcast(self, sig: Sig, ins: Instruction, src: Dims, out: Dims, k: int) -> None:
        key, c, add = sig.key(), self.c, self.t.add
        dims = list(ins.parsed.get("dimensions", []))
        if len(dims) != len(src):
            return
        # grp operand: d (and e) map onto dims of the same extent; an operand grp(d, K, -1) may
        # also take its block r mod K along a dim the broadcast creates (all its values equal).
        for d, e, si in self._pairs(src, k):
            if src[d] != out[dims[d]] or (e >= 0 and src[e] != out[dims[e]]):
                continue
            targets = [dims[e]] if e >= 0 else [-1, *(x for x in range(len(out)) if x not in dims)]
            for e2 in targets:
                so = gscale(out, dims[d], k, e2, c)
                if so:
                    add("gm1", key, d, k, e, dims[d], e2, sig.with_dims([si], so).key())
        # duplicate operand: d and e are created (or expanded from extent 1) by the broadcast.
        made = [x for x in range(len(out)) if x not in dims or src[dims.index(x)] == 1]
        for d, e, so in self._pairs(out, k):
            if d in made and (e < 0 or e in made):
                add("gbnew", key, d, k, e, sig.with_dims(None, so).key())

    def _reshape(self, sig: Sig, src: Dims, out: Dims, k: int) -> None:
        key, c, add = sig.key(), self.c, self.t.add
        q = c // k

        def whole(d: int) -> int | None:
            """The out dim that dim d of src maps onto as a whole (same extent, same prefix)."""
            for x in range(len(out)):
                if out[x] == src[d] and prod(out[:x]) == prod(src[:d]):
                    return x
            return None

        for d, e, si in self._pairs(src, k):
            d2 = whole(d)
            e2 = whole(e) if e >= 0 else -1
            if d2 is None or e2 is None:
                continue
            so = gscale(out, d2, k, e2, c)
            if so:
                add("gm1", key, d, k, e, d2, e2, sig.with_dims([si], so).key())
        # Sharded dim f (block r of c, contiguous) split as (q, B, T...): block r is index
        # floor(r/K) along the q-dim and block r mod K of B, the rest whole (B % K == 0).
        for f in range(len(src)):
            for d in range(len(out) - 1):
                if out[d] != q or prod(out[:d]) != prod(src[:f]) or out[d + 1] % k:
                    continue
                if not any(prod(out[d:j]) == src[f] for j in range(d + 2, len(out) + 1)):
                    continue
                si, so = scale(src, f, c), gscale(out, d, k, d + 1, c)
                if si and so:
                    add("gsplit", key, f, k, d, d + 1, sig.with_dims([si], so).key())
        # ... and back: merging d, d+1 (and whole dims after them) into f gives the plain split.
        for d in range(len(src) - 1):
            if src[d] != q or src[d + 1] % k:
                continue
            for f in range(len(out)):
                if prod(out[:f]) == prod(src[:d]) and any(prod(src[d:j]) == out[f] for j in range(d + 2, len(src) + 1)):
                    si, so = gscale(src, d, k, d + 1, c), scale(out, f, c)
                    if si and so:
                        add("gmerge", key, d, k, d + 1, f, sig.with_dims([si], so).key())

    def _dot(self, sig: Sig, ins: Instruction, ins_dims: list[Dims], out: Dims, k: int) -> None:
        key, c, add = sig.key(), self.c, self.t.add
        p = ins.parsed
        lb, rb = list(p.get("lhs_batch_dims", [])), list(p.get("rhs_batch_dims", []))
        lc, rc = list(p.get("lhs_contracting_dims", [])), list(p.get("rhs_contracting_dims", []))
        lhs, rhs = ins_dims
        lfree = [x for x in range(len(lhs)) if x not in lb and x not in lc]
        rfree = [x for x in range(len(rhs)) if x not in rb and x not in rc]
        lpos = {x: len(lb) + j for j, x in enumerate(lfree)}
        rpos = {x: len(lb) + len(lfree) + j for j, x in enumerate(rfree)}
        for i, (dl, dr) in enumerate(zip(lb, rb, strict=False)):
            options: list[tuple[int, int, int]] = [(-1, -1, -1)]
            options += [(x, -1, lpos[x]) for x in lfree]
            options += [(-1, x, rpos[x]) for x in rfree]
            options += [(lb[j], rb[j], j) for j in range(len(lb)) if j != i]
            for el, er, e2 in options:
                sl, sr, so = gscale(lhs, dl, k, el, c), gscale(rhs, dr, k, er, c), gscale(out, i, k, e2, c)
                if sl and sr and so:
                    add("gdot", key, dl, el, dr, er, k, i, e2, sig.with_dims([sl, sr], so).key())
