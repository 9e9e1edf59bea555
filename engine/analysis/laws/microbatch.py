"""Tables of rules/microbatch.egg: a batch cut into n equal microbatches along a dim, each run
through the same row-wise layers, and joined back in order (forwards), or reduced per block
and summed over the blocks (losses averaged over microbatches, gradients accumulated).

For every baseline signature and every block count n that a distributed literal slice cuts
(``sliceblock`` rows, laws/unroll._slice_blocks), the signature of the same instruction on one block:

``mbu(k, d, n, kp)``       unary pointwise k on dim d cut into n blocks is kp
``mbb(k, d, n, kp)``       binary pointwise with operands of one shape
``mbbc(k, d, n, kp)``      broadcast whose result dim d is new (no operand dim maps to it)
``mbdot(k, d, n, e, kp)``  dot whose lhs dim d is a free dim (neither batch nor contracting);
                           e is the result dim it becomes
``mbperm(k, d, n, f, kp)`` transpose moving operand dim d to result dim f
``mbkeep(k, d, n, f, kp)`` reduce (add/max/min/mul) over dims that exclude d: d becomes f
``mbred(k, d, n, kp)``     reduce(add) over dims that include d: block e's reduce is block e's
                           contribution to the whole reduce (kp keeps the result shape)
``mbcontract(k, dl, dr, n, kp)`` dot contracting lhs dim dl with rhs dim dr (one contracting
                           pair): block e of both operands gives block e's contribution
``mbrs(k, d, o, n, f, o2, kp)`` reshape: block e of n along input dim d read as [o, S/o]
                           (o = 1: a plain block) is block e along output dim f read as
                           [o2, S'/o2] (rules/microbatch.egg, strided blocks)
``mbstksum(k, w)``         reduce(add) over dim w alone (either side): a stack of microbatch
                           losses summed
``mbmove(k)``              broadcast or reshape (both sides): moves elements, so a division by
                           a constant passes through it (qdiv-move)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ops import BINARY_POINTWISE, UNARY_POINTWISE
from ..signature import scale

if TYPE_CHECKING:
    from ..graph import Graphs
    from ..signature import Sig

TABLES: tuple[str, ...] = ("mbu", "mbb", "mbbc", "mbdot", "mbperm", "mbkeep", "mbred", "mbcontract", "mbmove", "mbrs", "mbu2", "mbb2", "mbbc2", "mbdsh", "mbdrow", "mbstksum")

Rows = dict[str, list[tuple[object, ...]]]


def graph_rows(rows: Rows, g: Graphs) -> None:
    # The block counts the distributed program cuts (its literal slices) and, in one layer of a
    # partitioned program, the counts its inputs may be cut into (a parameter of b rows beside
    # a baseline one of n·b rows: the facts carried from the layer before say whether it is a
    # block). The rules that start a relation need a cut or a carried block (mbactive), so a
    # program without microbatches only pays the rows.
    counts = {int(r[4]) for r in rows.get("sliceblock", []) if isinstance(r[4], int) and r[4] > 1}  # type: ignore[arg-type]
    counts |= _boundary_counts(g)
    if not counts:
        return
    moves: set[str] = set()
    for node in g.nodes:
        if node.sig is None:
            continue
        if node.sig.opcode in ("broadcast", "reshape") and len(node.sig.ins) == 1:
            moves.add(node.sig.key())
        if node.side != "baseline":
            continue
        for n in sorted(counts):
            _rows(rows, node.sig, node.ins.parsed, n)
    rows["mbmove"].extend((k,) for k in sorted(moves))
    for node in g.nodes:
        # A reduce(add) over one dim alone, on either side: summing stacked microbatch losses.
        sig = node.sig
        if sig is not None and sig.opcode == "reduce" and len(sig.ins) == 2 and sig.ins[1][1] == () and node.ins.parsed.get("reducer") == "add":
            dims = _ints(node.ins.parsed, "dimensions")
            if len(dims) == 1:
                rows["mbstksum"].append((sig.key(), dims[0]))
    c = len(g.spec.groups[0]) if g.spec.groups else 1
    if c > 1:
        for node in g.nodes:
            if node.side == "baseline" and node.sig is not None:
                for n in sorted(counts):
                    _tp_rows(rows, node.sig, node.ins.parsed, n, c)


def _boundary_counts(g: Graphs) -> set[int]:
    """n for every baseline / distributed input pair of one rank whose shapes differ in exactly
    one dim, the baseline's n times the distributed's."""
    # Inputs of the segment: parameters, and the placeholders a folded layer's block reads
    # (operand-free custom-calls, engine/analysis/folded.py).
    shapes = {side: {tuple(n.ins.shape.dims) for n in g.nodes if n.side == side and not n.operands and n.ins.opcode in ("parameter", "custom-call") and not n.ins.shape.is_tuple} for side in ("baseline", "distributed")}
    out: set[int] = set()
    for b in shapes["baseline"]:
        for d in shapes["distributed"]:
            diff = [(x, y) for x, y in zip(b, d, strict=False) if x != y] if len(b) == len(d) else []
            if len(diff) == 1 and diff[0][1] > 0 and diff[0][0] % diff[0][1] == 0 and 1 < diff[0][0] // diff[0][1] <= 64:
                out.add(diff[0][0] // diff[0][1])
    return out


def _ints(parsed: dict[str, object], key: str) -> list[int]:
    return [int(x) for x in parsed.get(key, []) or []]  # type: ignore[union-attr]


def _rows(rows: Rows, sig: Sig, parsed: dict[str, object], n: int) -> None:
    op, k = sig.opcode, sig.key()
    out = sig.out[1]
    ins = [dims for _, dims in sig.ins]
    if op in UNARY_POINTWISE and len(ins) == 1 and ins[0] == out:
        for d in range(len(out)):
            s = scale(out, d, n)
            if s:
                rows["mbu"].append((k, d, n, sig.with_dims([s], s).key()))
    elif op in BINARY_POINTWISE and len(ins) == 2 and ins[0] == ins[1] == out:
        for d in range(len(out)):
            s = scale(out, d, n)
            if s:
                rows["mbb"].append((k, d, n, sig.with_dims([s, s], s).key()))
    elif op == "reshape" and len(ins) == 1:
        _reshape_rows(rows, sig, ins[0], out, n)
    elif op == "broadcast" and len(ins) == 1:
        mapped = _ints(parsed, "dimensions")
        for d in range(len(out)):
            s = scale(out, d, n)
            if s and d not in mapped:
                rows["mbbc"].append((k, d, n, sig.with_dims([ins[0]], s).key()))
    elif op == "transpose" and len(ins) == 1:
        perm = _ints(parsed, "dimensions")
        for f, d in enumerate(perm):
            si, so = scale(ins[0], d, n), scale(out, f, n)
            if si and so:
                rows["mbperm"].append((k, d, n, f, sig.with_dims([si], so).key()))
    elif op == "reduce" and len(ins) == 2 and ins[1] == ():
        # One operand and its scalar init: a reduce over `dims`. Row-wise along any dim it keeps;
        # a contribution (sum of blocks) along a dim it sums, for add only.
        dims = _ints(parsed, "dimensions")
        reducer = parsed.get("reducer")
        for d in range(len(ins[0])):
            si = scale(ins[0], d, n)
            if not si:
                continue
            if d in dims:
                if reducer == "add":
                    rows["mbred"].append((k, d, n, sig.with_dims([si, ins[1]], out).key()))
            elif reducer in ("add", "max", "min", "mul"):
                f = d - sum(1 for r in dims if r < d)
                so = scale(out, f, n)
                if so:
                    rows["mbkeep"].append((k, d, n, f, sig.with_dims([si, ins[1]], so).key()))
    elif op == "dot" and len(ins) == 2:
        lb, lc = _ints(parsed, "lhs_batch_dims"), _ints(parsed, "lhs_contracting_dims")
        rc = _ints(parsed, "rhs_contracting_dims")
        lhs, rhs = ins
        lfree = [d for d in range(len(lhs)) if d not in lb and d not in lc]
        for j, d in enumerate(lfree):
            e = len(lb) + j
            sl, so = scale(lhs, d, n), scale(out, e, n)
            if sl and so:
                rows["mbdot"].append((k, d, n, e, sig.with_dims([sl, rhs], so).key()))
        for dl, dr in zip(lc, rc, strict=False):
            sl, sr = scale(lhs, dl, n), scale(rhs, dr, n)
            if sl and sr:
                rows["mbcontract"].append((k, dl, dr, n, sig.with_dims([sl, sr], out).key()))


def _trailing(dims: tuple[int, ...], d: int) -> int:
    p = 1
    for x in dims[d + 1 :]:
        p *= x
    return p


def _reshape_rows(rows: Rows, sig: Sig, src: tuple[int, ...], out: tuple[int, ...], n: int) -> None:
    """mbrs rows of one reshape. Block e of n along dim d read as [o, i] (i = src[d] / o) is, in
    row-major flat order, the elements whose flat index f has f mod L in block e of n of
    [0, L), L = i times the element count after d, in increasing order (the block's own
    row-major order). A reshape keeps flat order, so on the output the same set is block e
    along every dim f whose trailing count P' gives i' = L / P' dividing out[f] with n | i'."""
    for d, size in enumerate(src):
        si = scale(src, d, n)
        if not si:
            continue
        for o in _divisors(size):  # not range(1, size + 1): dims of 10^4-10^5 (a 405B layer)
            if (size // o) % n:
                continue
            big = (size // o) * _trailing(src, d)
            for f, osize in enumerate(out):
                p = _trailing(out, f)
                if big % p:
                    continue
                i2 = big // p
                if osize % i2 or i2 % n:
                    continue
                so = scale(out, f, n)
                if so:
                    rows["mbrs"].append((sig.key(), d, o, n, f, osize // i2, sig.with_dims([si], so).key()))


def _divisors(x: int) -> list[int]:
    """The divisors of x >= 1, increasing."""
    small = [o for o in range(1, math.isqrt(x) + 1) if x % o == 0]
    return small + [x // o for o in reversed(small) if o * o != x]


def _scale2(dims: tuple[int, ...], d: int, n: int, f: int, c: int) -> tuple[int, ...] | None:
    """dims with dim d divided by n and dim f (another dim) by c."""
    if d == f:
        return None
    s = scale(dims, d, n)
    return scale(s, f, c) if s else None


def _tp_rows(rows: Rows, sig: Sig, parsed: dict[str, object], n: int, c: int) -> None:
    """A microbatch block (n blocks along d) of a tensor-parallel shard (c blocks along f):
    ``mbu2/mbb2(k, d, n, f, kp)`` pointwise; ``mbbc2(k, d, n, fs, f, kp)`` a broadcast creating
    d whose operand dim fs becomes f; ``mbdsh(k, d, n, g, dout, gout, kp)`` a dot with lhs free
    dim d and rhs free dim g (column-parallel); ``mbdrow(k, d, n, g, h, dout, kp)`` a dot with
    lhs free dim d contracting lhs dim g with rhs dim h (row-parallel)."""
    op, k = sig.opcode, sig.key()
    out = sig.out[1]
    ins = [dims for _, dims in sig.ins]
    if op in UNARY_POINTWISE and len(ins) == 1 and ins[0] == out:
        for d in range(len(out)):
            for f in range(len(out)):
                if s := _scale2(out, d, n, f, c):
                    rows["mbu2"].append((k, d, n, f, sig.with_dims([s], s).key()))
    elif op in BINARY_POINTWISE and len(ins) == 2 and ins[0] == ins[1] == out:
        for d in range(len(out)):
            for f in range(len(out)):
                if s := _scale2(out, d, n, f, c):
                    rows["mbb2"].append((k, d, n, f, sig.with_dims([s, s], s).key()))
    elif op == "broadcast" and len(ins) == 1:
        mapped = _ints(parsed, "dimensions")
        for fs, f in enumerate(mapped):
            si = scale(ins[0], fs, c)
            for d in range(len(out)):
                so = _scale2(out, d, n, f, c)
                if si and so and d not in mapped:
                    rows["mbbc2"].append((k, d, n, fs, f, sig.with_dims([si], so).key()))
    elif op == "dot" and len(ins) == 2:
        lb, lc = _ints(parsed, "lhs_batch_dims"), _ints(parsed, "lhs_contracting_dims")
        rb, rc = _ints(parsed, "rhs_batch_dims"), _ints(parsed, "rhs_contracting_dims")
        if lb or rb:
            return
        lhs, rhs = ins
        lfree = [d for d in range(len(lhs)) if d not in lc]
        rfree = [d for d in range(len(rhs)) if d not in rc]
        for j, d in enumerate(lfree):
            for i, g in enumerate(rfree):
                dout, gout = j, len(lfree) + i
                sl, sr, so = scale(lhs, d, n), scale(rhs, g, c), _scale2(out, dout, n, gout, c)
                if sl and sr and so:
                    rows["mbdsh"].append((k, d, n, g, dout, gout, sig.with_dims([sl, sr], so).key()))
            for gl, h in zip(lc, rc, strict=False):
                sl, sr, so = _scale2(lhs, d, n, gl, c), scale(rhs, h, c), scale(out, j, n)
                if sl and sr and so:
                    rows["mbdrow"].append((k, d, n, gl, h, j, sig.with_dims([sl, sr], so).key()))
