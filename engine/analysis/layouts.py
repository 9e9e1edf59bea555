"""Answer the layout family's composition requests with bijection inference.

The rules ask ``lwant-d L K k`` (the distributed side applies layout op k to a tensor related by
layout L and kind K) or ``lwant-b L K k`` (the baseline side does). The answer row says which
layout and kind relate the results, or is absent when no split/merge bijection exists.
"""

from __future__ import annotations

from .bijection import Layout, _runs
from .signature import Sig, prod, scale
from .tables import unit_block_broadcast

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
        if n != bout[b0] or n < 2:
            return None
        view, view_out, new_kind = bsrc, bout, kind
        if kind.startswith("s:"):
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
        atoms, perm = list(layout.atoms), list(layout.perm)
        sruns = _runs(layout.src, atoms)
        druns = _runs(layout.dst, [atoms[i] for i in perm])
        if sruns is None or druns is None:
            return None
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
            if e == db_:
                return None
            view = scale(bsrc, e, self.c)
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
        atoms, perm = list(layout.atoms), list(layout.perm)
        sruns = _runs(layout.src, atoms)
        druns = _runs(layout.dst, [atoms[i] for i in perm])
        if sruns is None or druns is None:
            return None
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

    def describe(self, lkey: str) -> list[str]:
        layout = self.layouts.get(lkey)
        return layout.ops() if layout else []


def _perm(sig: Sig) -> list[int]:
    text = sig.attr("dimensions") or "[]"
    return [int(x) for x in text.strip("[]").split(",") if x.strip()]


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
