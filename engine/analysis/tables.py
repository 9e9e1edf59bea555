"""Shape arithmetic the rules consult: facts about single signatures, never about relations.

The laws live in ``rules/*.egg``; a law such as "a pointwise map commutes with block sharding"
needs to know, for a given baseline signature, which input dimension becomes which output
dimension and what the per-rank signature is. Those are pure functions of one signature and the
group size ``c``, computed here once per distinct signature and loaded as TSV tables:

``moves1(k, d, e, kp)``      unary k sends block-sharding on input dim d to output dim e;
                             kp is its per-rank signature (any block order along d survives).
``moves1p(k, d, e, kp)``     the same, but only for plain (contiguous) sharding (reshape, slice).
``bcastnew(k, e, kp)``       broadcast k creates output dim e; kp broadcasts into e/c.
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
``allreduce(k, op)``, ``allgather(k, d)``, ``reducescatter(k, d, op)``: collectives over the
                             sharding group (dist signatures only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..ir import Instruction
from .ops import BINARY_POINTWISE, MONOTONE, TERNARY_POINTWISE, UNARY_POINTWISE, monotone_convert
from .signature import Dims, Sig, prod, scale

Row = tuple[object, ...]

IDENTITY_INIT = {"add": ("0", "-0"), "max": ("-inf",), "min": ("inf",)}


class Tables:
    def __init__(self, c: int) -> None:
        self.c = c
        self.rows: dict[str, set[Row]] = defaultdict(set)

    def add(self, table: str, *row: object) -> None:
        self.rows[table].add(row)

    # -- baseline signatures -------------------------------------------------------------------
    def baseline(self, sig: Sig, ins: Instruction, init_literal: str | None = None, block_specs: Iterable[tuple[int, ...]] = ()) -> None:
        op, c = sig.opcode, self.c
        k = sig.key()
        ins_dims = [d for _, d in sig.ins]
        out = sig.out[1]
        if op in UNARY_POINTWISE:
            for d in range(len(out)):
                s = scale(out, d, c)
                if s:
                    self.add("moves1", k, d, d, sig.with_dims([s], s).key())
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
            if op in ("add", "subtract"):
                self.add("lin2", k, "add")
            if op == "multiply":
                self.add("lin2l", k, "add")
                self.add("lin2r", k, "add")
            if op == "divide":
                self.add("lin2l", k, "add")
            if op == "maximum":
                self.add("lin2", k, "max")
                self.add("lin2l", k, "max")
                self.add("lin2r", k, "max")
            if op == "minimum":
                self.add("lin2", k, "min")
                self.add("lin2l", k, "min")
                self.add("lin2r", k, "min")
            if op in ("add", "subtract"):
                # max_r(a_r ± b) = max_r(a_r) ± b for b identical on every rank
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
            for e in range(len(out)):
                if e not in dims:
                    so = scale(out, e, c)
                    if so:
                        self.add("bcastnew", k, e, sig.with_dims(None, so).key())
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
            self._reduce(sig, k, ins, ins_dims[0], out, init_literal)
        elif op == "dot":
            self._dot(sig, k, ins, ins_dims, out)
        elif op == "pad":
            pads = ins.parsed.get("padding", [])
            for d in range(len(out)):
                if d < len(pads) and tuple(pads[d]) == (0, 0, 0):
                    si, so = scale(ins_dims[0], d, c), scale(out, d, c)
                    if si and so:
                        self.add("moves2l", k, d, d, sig.with_dims([si, ins_dims[1]], so).key())
        elif op == "gather":
            self._gather(sig, k, ins, ins_dims, out)
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

    def _reduce(self, sig: Sig, k: str, ins: Instruction, src: Dims, out: Dims, init: str | None) -> None:
        c = self.c
        dims = sorted(ins.parsed.get("dimensions", []))
        reducer = ins.parsed.get("reducer")
        identity = reducer in IDENTITY_INIT and init is not None and _literal_value(init) in IDENTITY_INIT[reducer]
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
        self.add("lin2l", k, "add")
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

    def permute(self, sig: Sig, ins: Instruction, groups: list[list[int]]) -> None:
        pairs = ins.parsed.get("source_target_pairs") or []
        targets = {t for _, t in pairs}
        if all(set(g) <= targets for g in groups) and len(targets) == len(pairs):
            self.add("permuteall", sig.key())


def _literal_value(text: str) -> str:
    t = text.strip().strip("{}").strip()
    try:
        f = float(t)
    except ValueError:
        return t
    if f == 0:
        return "0"
    if f == float("inf"):
        return "inf"
    if f == float("-inf"):
        return "-inf"
    return t
