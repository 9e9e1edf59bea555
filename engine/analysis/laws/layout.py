"""The layout family (rules/layout.egg): tensors related through a split/merge bijection.

Tables written while the graphs are built:

``layoutop(k)``       k is a reshape or transpose (a layout op);
``ew(k, n)``          k is pointwise, n its name without shapes (the same map on any shape);
``dotop(k)``, ``reduceop(k)``: k is a dot, a reduce of one array;
``bcastone(k)``       broadcast k adds one dim, keeping the operand's dims in order;
``kind-sh``, ``kind-p``, ``kind-plain``, ``kind-g``: the relation kinds a layout carries (sharded
                      along d, partial by op, duplicate, rank-group grp(d, K) for the group
                      factors K the distributed graph selects with: core.group_factors).

``ubcast`` and ``bcastunit``/``bcastexpand`` are shape rows of core.Tables.

The rules then ask ``lwant-d L K k`` (the distributed side applies layout op k to a tensor
related by layout L and kind K) or ``lwant-b L K k`` (the baseline side does); LayoutSolver
answers between saturation runs: the answer row says which layout and kind relate the results,
or is absent when no split/merge bijection exists.

Side conditions: a layout is a bijection of element positions (values move, none change), so the
laws hold for every element type; a kind survives only ops that act the same on every element
(``ew`` by name) or whose dims the bijection maps whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ir import Instruction, Shape
from ..bijection import Layout, _runs
from ..ops import BINARY_POINTWISE, TERNARY_POINTWISE, UNARY_POINTWISE
from ..signature import Sig, prod, scale
from .core import group_factors, unit_block_broadcast

if TYPE_CHECKING:
    from ..graph import Graphs

Rows = dict[str, list[tuple[object, ...]]]
POINTWISE = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE
TABLES = ("layoutop", "ew", "dotop", "reduceop", "bcastone", "kind-sh", "kind-p", "kind-plain", "kind-g")
OPCODES = frozenset({"reshape", "transpose", "dot", "reduce", "broadcast"} | POINTWISE)


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    op, key = ins.opcode, sig.key()
    if op in ("reshape", "transpose"):
        rows["layoutop"].append((key,))
    if op in POINTWISE:
        rows["ew"].append((key, sig.pointwise_name()))
    if op == "dot":
        rows["dotop"].append((key,))
    if op == "reduce" and len(opnd) == 2:
        rows["reduceop"].append((key,))  # a reduce under a layout
    if op == "broadcast" and opnd and len(ins.shape.dims) == len(opnd[0].dims) + 1 and list(ins.parsed.get("dimensions", [])) == sorted(ins.parsed.get("dimensions", [])):
        rows["bcastone"].append((key,))  # one new dim, the others in order


def graph_rows(rows: Rows, g: Graphs) -> None:
    for d in range(8):
        rows["kind-sh"].append((f"s:{d}", d))
        rows["kind-plain"].append((f"s:{d}",))
    rows["kind-plain"].append(("dup",))
    rows["kind-p"].extend((f"p:{op}", op) for op in ("add", "max", "min"))
    # Rank-group kinds (grp under a layout): only for the group factors the distributed graph
    # selects with, so other programs pay nothing.
    rows["kind-g"].extend((f"g:{d}:{k}", d, k) for d in range(8) for k in group_factors(g))

ID = "id"


class LayoutSolver:
    def __init__(self, c: int) -> None:
        self.c = c
        self.layouts: dict[str, Layout] = {}

    def _key(self, layout: Layout) -> str:
        if layout.is_identity():
            return ID
        k = layout.key()
        self.layouts[k] = layout
        return k

    def _get(self, key: str, shape: tuple[int, ...]) -> Layout | None:
        if key == ID:
            return Layout.identity(shape)
        if key not in self.layouts:
            # A layout the tables wrote (tables.alltoall_layouts), not one this solver made:
            # its canonical key spells it out.
            parsed = parse_key(key)
            if parsed is not None:
                self.layouts[key] = parsed
        return self.layouts.get(key)

    def step(self, side: str, lkey: str, kind: str, sig: Sig) -> tuple[str, str] | None:
        src = sig.ins[0][1]
        out = sig.out[1]
        perm = _perm(sig)
        if side == "d":
            if sig.opcode not in ("transpose", "reshape"):
                return None
            layout = self._get(lkey, src)
            if layout is None or layout.src != src:
                return None
            new = layout.then_src_transpose(perm) if sig.opcode == "transpose" else layout.then_src_reshape(out)
            return None if new is None else (self._key(new), kind)
        # Baseline side: the laid-out distributed tensor has x's shape, or its per-rank block.
        if sig.opcode not in ("transpose", "reshape", "broadcast"):
            return None
        if kind.startswith("g:"):
            return self._group_step(lkey, kind, sig)
        if kind.startswith("s:"):
            if sig.opcode == "broadcast":
                return None
            d = int(kind[2:])
            per_rank_src = scale(src, d, self.c)
            if per_rank_src is None:
                return None
            layout = self._get(lkey, per_rank_src)
            if layout is None or layout.dst != per_rank_src:
                return None
            if sig.opcode == "transpose":
                return self._key(layout.then_dst_transpose(perm)), f"s:{perm.index(d)}"
            for e in range(len(out)):
                if prod(src[:d]) == prod(out[:e]) and out[e] % self.c == 0:
                    per_rank_out = scale(out, e, self.c)
                    new = layout.then_dst_reshape(per_rank_out) if per_rank_out else None
                    if new is not None:
                        return self._key(new), f"s:{e}"
            return None
        layout = self._get(lkey, src)
        if layout is None or layout.dst != src:
            return None
        if sig.opcode == "broadcast":
            # Only for a duplicate: block r along e of broadcast(x) is reshape(x) to the block's
            # shape (unit_block_broadcast), so L(x') = x gives reshape∘L (x') = that block.
            e = unit_block_broadcast(src, out, perm, self.c)
            if kind != "dup" or e is None:
                return None
            new = layout.then_dst_reshape((*out[:e], 1, *out[e + 1 :]))
            return None if new is None else (self._key(new), f"s:{e}")
        new = layout.then_dst_transpose(perm) if sig.opcode == "transpose" else layout.then_dst_reshape(out)
        return None if new is None else (self._key(new), kind)

    def _group_step(self, lkey: str, kind: str, sig: Sig) -> tuple[str, str] | None:
        """A baseline transpose of x where L(x') is block floor(r/K) of q = c/K blocks of x along
        d (kind ``g:d:K``, the rank-group relation grp with e = -1, rules/layout.egg): the
        block moves with the transpose to dim perm.index(d), and L composes with the transpose
        of the block. Reshapes are not stepped (a rank-group block need not stay contiguous)."""
        if sig.opcode != "transpose":
            return None
        try:
            d, k = (int(v) for v in kind[2:].split(":"))
        except ValueError:
            return None
        src = sig.ins[0][1]
        if k <= 0 or self.c % k or not 0 <= d < len(src):
            return None
        q = self.c // k
        if src[d] % q:
            return None
        per_rank_src = (*src[:d], src[d] // q, *src[d + 1 :])
        layout = self._get(lkey, per_rank_src)
        if layout is None or layout.dst != per_rank_src:
            return None
        perm = _perm(sig)
        return self._key(layout.then_dst_transpose(perm)), f"g:{perm.index(d)}:{k}"

    def pair_step(self, lkey: str, kind: str, base: Sig, dist: Sig) -> tuple[str, str] | None:
        """rules/layout.egg lwant-pair: the same reduce or broadcast on both sides under L."""
        if base.opcode == "broadcast" and dist.opcode == "broadcast":
            return self.broadcast_step(lkey, kind, base, dist)
        return self.reduce_step(lkey, kind, base, dist)

    def broadcast_step(self, lkey: str, kind: str, base: Sig, dist: Sig) -> tuple[str, str] | None:
        """Both sides broadcast into one new dim of the same extent n (every operand dim kept, in
        order): the baseline at db, the rank at dd. Law: z[.., j, ..] = x[..] and z'[.., j, ..] =
        x'[..], so L extended by the identity on the new dim (one atom of n, placed after the
        atoms of the dims before it on each side) maps z' to z (dup) or to its block along e
        (s:e, shifted past db). Every dtype: values are only repeated."""
        bd, dd = _perm(base), _perm(dist)
        src, out = dist.ins[0][1], dist.out[1]
        bsrc, bout = base.ins[0][1], base.out[1]
        newd = [x for x in range(len(out)) if x not in dd]
        newb = [x for x in range(len(bout)) if x not in bd]
        if len(newd) != 1 or len(newb) != 1 or dd != sorted(dd) or bd != sorted(bd):
            return None
        if [out[x] for x in dd] != list(src) or [bout[x] for x in bd] != list(bsrc):
            return None
        d0, b0 = newd[0], newb[0]
        n = out[d0]
        view, view_out, new_kind = bsrc, bout, kind
        if kind == "dup" and n * self.c == bout[b0] and n >= 1 and self.c > 1:
            # The rank broadcasts into w = n/c where the baseline broadcasts into n (the max
            # spread back over a vocab-sharded dim): every position along the new dim holds the
            # same values, so z' is block r of z along b0 (rules/layout.egg layout-bcast-sharded).
            view_out, new_kind = scale(bout, b0, self.c), f"s:{b0}"
            if view_out is None:
                return None
        elif n != bout[b0] or n < 2:
            return None
        elif kind.startswith("s:"):
            e = int(kind[2:])
            view, view_out = scale(bsrc, e, self.c), scale(bout, bd[e], self.c) if 0 <= e < len(bd) else None
            if view is None or view_out is None:
                return None
            new_kind = f"s:{bd[e]}"
        elif kind != "dup":
            return None
        layout = self._get(lkey, src)
        if layout is None or layout.src != src or layout.dst != view:
            return None
        runs = _atom_runs(layout)
        if runs is None:
            return None
        atoms, perm, sruns, druns = runs
        a = sruns[d0 - 1][1] if d0 > 0 else 0  # the new atom's place in the rank's order
        b = druns[b0 - 1][1] if b0 > 0 else 0  # and in the baseline's
        new_atoms = [*atoms[:a], n, *atoms[a:]]
        shifted = [p + 1 if p >= a else p for p in perm]
        new_perm = [*shifted[:b], a, *shifted[b:]]
        try:
            new = Layout(tuple(out), tuple(view_out), tuple(new_atoms), tuple(new_perm))
        except ValueError:
            return None
        return self._key(new), new_kind

    def reduce_step(self, lkey: str, kind: str, base: Sig, dist: Sig) -> tuple[str, str] | None:
        """A reduce of one dim on both sides under a layout L (rules/layout.egg lred): the
        baseline reduces dim db of x, the rank dim dd of x', with L(x') = x (dup) or x's block
        along e != db (s:e). When L carries dim dd of x' onto dim db as the same atoms in the
        same order, both reduce the same elements in the same order, and L without those atoms
        relates the results. Returns (L2, kind) or None."""
        if base.opcode != "reduce" or dist.opcode != "reduce" or len(base.ins) != 2 or len(dist.ins) != 2:
            return None
        if base.attr("reducer") is None or base.attr("reducer") != dist.attr("reducer"):
            return None
        db, dd = _perm(base), _perm(dist)
        if len(db) != 1 or len(dd) != 1:
            return None
        db_, dd_ = db[0], dd[0]
        src, bsrc = dist.ins[0][1], base.ins[0][1]
        view = bsrc
        new_kind = kind
        if kind.startswith("s:"):
            e = int(kind[2:])
            view = scale(bsrc, e, self.c)
            if e == db_ and view is not None:
                # The reduced dim is the sharded one: each rank reduces its block, the op over the
                # ranks of the blocks' results is the baseline's (a partial of the reducer; the
                # rules check each init is an identity of it: rules/layout.egg
                # layout-reduce-sharded).
                layout = self._get(lkey, src)
                if layout is None or layout.src != src or layout.dst != view or src[dd_] != view[db_]:
                    return None
                return self._drop_dim(layout, dd_, db_, f"p:{base.attr('reducer')}")
            if view is None:
                return None
            new_kind = f"s:{e - (1 if e > db_ else 0)}"
        elif kind != "dup":
            return None
        layout = self._get(lkey, src)
        if layout is None or layout.src != src or layout.dst != view or src[dd_] != view[db_] or src[dd_] < 2:
            return None
        return self._drop_dim(layout, dd_, db_, new_kind)

    def _drop_dim(self, layout: Layout, dd: int, db: int, kind: str) -> tuple[str, str] | None:
        runs = _atom_runs(layout)
        if runs is None:
            return None
        atoms, perm, sruns, druns = runs
        a0, a1 = sruns[dd]
        b0, b1 = druns[db]
        if a1 <= a0 or perm[b0:b1] != list(range(a0, a1)):
            return None
        n = a1 - a0
        new_atoms = atoms[:a0] + atoms[a1:]
        new_perm = [p - n if p >= a1 else p for p in perm[:b0] + perm[b1:]]
        new_src = (*layout.src[:dd], *layout.src[dd + 1 :])
        new_dst = (*layout.dst[:db], *layout.dst[db + 1 :])
        try:
            new = Layout(new_src, new_dst, tuple(new_atoms), tuple(new_perm)) if new_atoms else Layout(new_src, new_dst)
        except ValueError:
            return None
        return self._key(new), kind

    def dot_step(self, lkey: str, k1: str, k2: str, base: Sig, dist: Sig) -> tuple[str, str] | None:
        """Relabel the rows of a dot whose lhs is laid out by L (see rules/layout.egg).

        Supported: no batch dims, the lhs contracts its last dim, a 2-D rhs. The lhs kind k1 is
        dup (then the rhs is dup or sharded on its free dim) or sharded on the contracted dim
        (then the rhs is sharded on its contracted dim and the result is a partial sum)."""
        if base.opcode != "dot" or dist.opcode != "dot":
            return None
        for name in ("lhs_batch_dims", "rhs_batch_dims"):
            if (base.attr(name) or "[]") != "[]" or (dist.attr(name) or "[]") != "[]":
                return None
        (_, sb), (_, rb) = base.ins
        (_, sd), (_, rd) = dist.ins
        if base.attr("lhs_contracting_dims") != str([len(sb) - 1]) or dist.attr("lhs_contracting_dims") != str([len(sd) - 1]):
            return None
        if base.attr("rhs_contracting_dims") != dist.attr("rhs_contracting_dims") or len(rb) != 2:
            return None
        rc = int((base.attr("rhs_contracting_dims") or "[0]").strip("[]"))
        free = 1 - rc
        lhs_view = sb  # the shape L must produce: the baseline lhs, or its per-rank block
        if k1 == "dup" and k2 == "dup" and rd == rb:
            n, kind = rb[free], "dup"
        elif k1 == "dup" and k2 == f"s:{free}" and rd == scale(rb, free, self.c):
            n, kind = rd[free], f"s:{len(sb) - 1}"
        elif k1 == f"s:{len(sb) - 1}" and k2 == f"s:{rc}" and rd == scale(rb, rc, self.c):
            per_rank = scale(sb, len(sb) - 1, self.c)
            if per_rank is None:
                return None
            lhs_view, n, kind = per_rank, rb[free], "p:add"
        else:
            return None
        layout = self._get(lkey, sd)
        if layout is None or layout.src != sd or layout.dst != lhs_view or sd[-1] != lhs_view[-1]:
            return None
        h = sd[-1]
        atoms, perm = list(layout.atoms), list(layout.perm)
        # The contracted axis must be the trailing atom(s) in both orders, untouched.
        if not atoms or perm[-1] != len(atoms) - 1 or atoms[-1] % h:
            return None
        rest = atoms[-1] // h
        if rest > 1:
            atoms[-1] = rest
        else:
            atoms.pop()
            perm.pop()
        src, dst = (*sd[:-1], n), (*lhs_view[:-1], n)
        expect_base = (*sb[:-1], rb[free])
        if dist.out[1] != src or base.out[1] != expect_base:
            return None
        new = Layout(src, dst, (*atoms, n), (*perm, len(atoms)))
        return self._key(new), kind

    def dot2_step(self, l1: str, k1: str, l2: str, k2: str, base: Sig, dist: Sig) -> tuple[str, str] | None:
        """A dot whose two operands each relate through a layout that only permutes whole dims and
        inserts or removes unit dims (rules/layout.egg lwant-dot2).

        Law: let L1(x') be x (dup) or its block along e1 (s:e1), L2(y') likewise for y, where L1
        and L2 map every non-unit dim of x' (y') whole onto one dim of the block. When the rank's
        dot pairs (batch, contracting) the dims that L1/L2 carry onto the baseline's non-unit
        batch and contracting pairs, in the same order, both dots multiply the same element pairs
        and sum the same products in the same order (a unit dim contributes one index, a
        contraction over it one product), so the rank's result, its dims carried the same way
        (L3: a permutation plus unit dims), is the baseline's dot of the blocks: z itself (both
        dup), z's block along the output dim of a sharded batch pair or free dim, or a partial sum
        (p:add) when both operands are split along one contracting pair. It arises when one head
        per rank makes XLA drop the unit head (batch) dim of the rank's attention dots.
        Every dtype: the same products and sums in the same order (p:add is the partial-sum
        kind every sharded contraction already has)."""
        if base.opcode != "dot" or dist.opcode != "dot" or len(base.ins) != 2 or len(dist.ins) != 2:
            return None
        dims = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")
        if {k: v for k, v in base.attrs if k not in dims} != {k: v for k, v in dist.attrs if k not in dims}:
            return None  # precision, result type: the same dot apart from its dims
        if [t for t, _ in base.ins] != [t for t, _ in dist.ins] or base.out[0] != dist.out[0]:
            return None
        bl, rbl, bc, rbc = (_ints(base.attr(n)) for n in dims)
        dl, rdl, dc, rdc = (_ints(dist.attr(n)) for n in dims)
        (_, sb), (_, rb) = base.ins
        (_, sd), (_, rd) = dist.ins
        nb = len(bl)
        lfree = [d for d in range(len(sb)) if d not in bl and d not in bc]
        rfree = [d for d in range(len(rb)) if d not in rbl and d not in rbc]
        kind, out_dim = "dup", -1
        if k1 == "dup" and k2 == "dup":
            pass
        elif k1.startswith("s:") and k2.startswith("s:") and (int(k1[2:]), int(k2[2:])) in zip(bl, rbl, strict=True):
            kind, out_dim = "s", list(zip(bl, rbl, strict=True)).index((int(k1[2:]), int(k2[2:])))
        elif k1.startswith("s:") and k2.startswith("s:") and (int(k1[2:]), int(k2[2:])) in zip(bc, rbc, strict=True):
            kind = "p:add"
        elif k1.startswith("s:") and k2 == "dup" and int(k1[2:]) in lfree:
            kind, out_dim = "s", nb + lfree.index(int(k1[2:]))
        elif k1 == "dup" and k2.startswith("s:") and int(k2[2:]) in rfree:
            kind, out_dim = "s", nb + len(lfree) + rfree.index(int(k2[2:]))
        else:
            return None
        views = [sb if k == "dup" else scale(sb, int(k[2:]), self.c) for k in (k1,)] + [rb if k == "dup" else scale(rb, int(k[2:]), self.c) for k in (k2,)]
        if views[0] is None or views[1] is None:
            return None
        vl, vr = views[0], views[1]
        s1 = self._dim_map(l1, sd, vl)
        s2 = self._dim_map(l2, rd, vr)
        if s1 is None or s2 is None:
            return None

        def pairs(a: list[int], b: list[int], ext: tuple[int, ...], m1: dict[int, int] | None, m2: dict[int, int] | None) -> list[tuple[int, int]] | None:
            out = []
            for i, j in zip(a, b, strict=True):
                if ext[i] == 1:
                    continue
                if m1 is None or m2 is None:
                    out.append((i, j))
                elif i in m1 and j in m2:
                    out.append((m1[i], m2[j]))
                else:
                    return None
            return out

        if len(dl) != len(rdl) or len(dc) != len(rdc) or len(bl) != len(rbl) or len(bc) != len(rbc):
            return None
        db, dcp = pairs(dl, rdl, sd, s1, s2), pairs(dc, rdc, sd, s1, s2)
        bb, bcp = pairs(bl, rbl, vl, None, None), pairs(bc, rbc, vl, None, None)
        if db is None or dcp is None or dcp != bcp or sorted(db) != sorted(bb or []):
            return None
        # Each non-unit dim of the rank's result: where it lands in the baseline's result.
        dlfree = [d for d in range(len(sd)) if d not in dl and d not in dc]
        drfree = [d for d in range(len(rd)) if d not in rdl and d not in rdc]
        bb_all = list(zip(bl, rbl, strict=True))
        land: list[int | None] = [bb_all.index((s1[i], s2[j])) if i in s1 and j in s2 and (s1[i], s2[j]) in bb_all else None for i, j in zip(dl, rdl, strict=True)]
        land += [nb + lfree.index(s1[d]) if d in s1 and s1[d] in lfree else None for d in dlfree]
        land += [nb + len(lfree) + rfree.index(s2[d]) if d in s2 and s2[d] in rfree else None for d in drfree]
        out_d = dist.out[1]
        out_b = base.out[1]
        view_out = out_b if kind != "s" else scale(out_b, out_dim, self.c)
        if view_out is None or len(land) != len(out_d):
            return None
        atoms, where = [], []
        for d, e in enumerate(land):
            if out_d[d] == 1:
                continue
            if e is None or view_out[e] != out_d[d]:
                return None
            atoms.append(out_d[d])
            where.append(e)
        order = sorted(range(len(where)), key=lambda i: where[i])
        if sorted(where) != [e for e in range(len(view_out)) if view_out[e] != 1]:
            return None
        try:
            new = Layout(tuple(out_d), tuple(view_out), tuple(atoms), tuple(order)) if atoms else Layout(tuple(out_d), tuple(view_out))
        except ValueError:
            return None
        return self._key(new), (f"s:{out_dim}" if kind == "s" else kind)

    def _dim_map(self, lkey: str, src: tuple[int, ...], dst: tuple[int, ...]) -> dict[int, int] | None:
        """Dim d of src -> the dim of dst that layout lkey carries it onto whole, for every
        non-unit d; None when the layout is another map (a dim split, merged or reordered)."""
        layout = self._get(lkey, src)
        if layout is None or layout.src != src or layout.dst != dst:
            return None
        runs = _atom_runs(layout)
        if runs is None:
            return None
        _, perm, sruns, druns = runs
        found: dict[int, int] = {}
        for d, (a0, a1) in enumerate(sruns):
            if a1 == a0:
                continue
            hit = [e for e, (b0, b1) in enumerate(druns) if perm[b0:b1] == list(range(a0, a1))]
            if len(hit) != 1:
                return None
            found[d] = hit[0]
        return found

    def describe(self, lkey: str) -> list[str]:
        layout = self.layouts.get(lkey)
        return layout.ops() if layout else []


def _atom_runs(layout: Layout) -> tuple[list[int], list[int], list[tuple[int, int]], list[tuple[int, int]]] | None:
    """The layout's atoms, their order on the destination side, and the run of atoms each dim
    of the source and of the destination covers; None when a dim cuts an atom."""
    atoms, perm = list(layout.atoms), list(layout.perm)
    sruns = _runs(layout.src, atoms)
    druns = _runs(layout.dst, [atoms[i] for i in perm])
    if sruns is None or druns is None:
        return None
    return atoms, perm, sruns, druns


def _perm(sig: Sig) -> list[int]:
    text = sig.attr("dimensions") or "[]"
    return [int(x) for x in text.strip("[]").split(",") if x.strip()]


def _ints(text: str | None) -> list[int]:
    """A dims attribute ("[0,2]", absent for none) as a list."""
    return [int(x) for x in (text or "[]").strip("[]{} ").split(",") if x.strip()]


def parse_key(key: str) -> Layout | None:
    """The layout whose canonical key (Layout.key) is ``key``; None for any other text."""
    if not (key.startswith("bij(") and key.endswith(")")):
        return None
    try:
        src_atoms, perm, dst = key[4:-1].split("|")
        src, atoms = src_atoms.split(":")

        def ints(text: str) -> tuple[int, ...]:
            return tuple(int(v) for v in text.split(",")) if text else ()

        layout = Layout(ints(src), ints(dst), ints(atoms), ints(perm))
    except ValueError:
        return None
    return layout if layout.key() == key else None
