"""Tables of rules/expertlist.egg: experts held as a list per rank (DeepSpeed's ``Experts`` and
code written like it), fed by the all-to-all of a duplicate, or selected by the rank's index.

Rank r of an expert-parallel group of c holds n = E/c local experts; its local expert j is the
baseline's expert r*n + j, and the tokens it runs are c identical copies (one from every rank)
of the baseline expert's tokens, stacked along a dim a whose baseline extent is c times
smaller. Every table relates a baseline signature k to the distributed signature kp of the
same instruction on such a tiled operand (dim a multiplied by c):

``xt1(k, kp, a, a2)``        unary k (pointwise, reshape, transpose, broadcast keeping a) whose
                             operand dim a becomes result dim a2; kp is k with both multiplied.
                             A reshape qualifies when the element counts before a and before a2
                             are equal, so the c copies stay the outermost factor of a2.
``xtb(k, kp, a2)``           broadcast creating dim a2 (no operand dim maps to it): kp creates
                             it c times larger (a created dim holds copies whatever its extent)
``xt2(k, kp, a)``            binary pointwise, both operands and the result tiled along a
``xtdot(k, kp, a, a2, s)``   dot whose operand s (0 lhs, 1 rhs) has free dim a (neither batch
                             nor contracting), result dim a2; the other operand untouched
``xrs(k, S, T)``              reshape k (either program) from shape S to shape T (shapes as text,
                             element type included)
``xa2a(k, s, S, n)``         distributed all-to-all k along s of shape S, n = S[s]
``xsplit3(kp, s, Y)``        distributed reshape kp from S to S[:s] + (c, S[s]/c) + S[s+1:];
                             Y = S[:s] + (1, S[s]) + S[s+1:] (the baseline's view of the same
                             rows with its all-to-all of one rank)
``xmergep(kp, a)``           distributed reshape merging (c, m) at (a, a+1) into c*m
``xlocal(k)``                a signature both programs run that is not a collective: it computes
                             on one rank from that rank's operands alone
``xcat(k, kp, d, a, n)``     concatenates along d: k of c*n operands of shape S, kp of n
                             operands of shape S with dim a multiplied by c

The tiled tables are only built when the distributed program has an all-to-all (the only way
such copies arise), so other programs pay nothing for them.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import TYPE_CHECKING

from ..ops import BINARY_POINTWISE, COLLECTIVES, UNARY_POINTWISE

if TYPE_CHECKING:
    from ..graph import Graphs
    from ..signature import Dims, Sig

TABLES: tuple[str, ...] = ("xt1", "xtb", "xt2", "xtdot", "xcat", "xlocal", "xrs", "xa2a", "xsplit3", "xmergep")

Rows = dict[str, list[tuple[object, ...]]]


def _times(dims: Dims, d: int, c: int) -> Dims:
    return (*dims[:d], dims[d] * c, *dims[d + 1 :])


def _ints(parsed: dict[str, object], name: str) -> list[int]:
    v = parsed.get(name, [])
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else []  # type: ignore[call-overload]


def graph_rows(rows: Rows, g: Graphs) -> None:
    c = g.spec.c
    if c < 2:
        return
    dist = {n.sig.key() for n in g.nodes if n.side == "distributed" and n.sig is not None}
    tiles = any(n.side == "distributed" and n.ins.opcode == "all-to-all" for n in g.nodes)
    seen: set[str] = set()
    for node in g.nodes:
        if node.side != "baseline" or node.sig is None:
            continue
        k = node.sig.key()
        if k in seen:
            continue
        seen.add(k)
        if k in dist and node.sig.opcode not in COLLECTIVES:
            rows["xlocal"].append((k,))
        if tiles:
            _rows(rows, node.sig, node.ins.parsed, c, dist)
    if tiles:
        for node in g.nodes:
            if node.sig is not None:
                _shape_rows(rows, node.side, node.sig, c)


def _text(dtype: str, dims: Dims) -> str:
    return f"{dtype}[{'x'.join(map(str, dims))}]"


def _shape_rows(rows: Rows, side: str, sig: Sig, c: int) -> None:
    """Reshapes of both programs as shapes; the distributed all-to-alls and the reshapes that
    split or merge the c copies (xrs, xa2a, xsplit3, xmergep)."""
    if len(sig.ins) != 1:
        return
    k, (dtype, src), out = sig.key(), sig.ins[0], sig.out[1]
    if sig.opcode == "reshape":
        rows["xrs"].append((k, _text(dtype, src), _text(dtype, out)))
        if side != "distributed":
            return
        for s in range(len(src)):
            if src[s] % c == 0 and out == (*src[:s], c, src[s] // c, *src[s + 1 :]):
                rows["xsplit3"].append((k, s, _text(dtype, (*src[:s], 1, src[s], *src[s + 1 :]))))
        for a in range(len(src) - 1):
            if src[a] == c and out == (*src[:a], c * src[a + 1], *src[a + 2 :]):
                rows["xmergep"].append((k, a))
    elif sig.opcode == "all-to-all" and side == "distributed" and src == out:
        for s in range(len(src)):
            rows["xa2a"].append((k, s, _text(dtype, src), src[s]))


def _rows(rows: Rows, sig: Sig, parsed: dict[str, object], c: int, dist: set[str]) -> None:
    op, k = sig.opcode, sig.key()
    out = sig.out[1]
    ins = [dims for _, dims in sig.ins]

    def add(table: str, kp: Sig, *args: object) -> None:
        key = kp.key()
        if key in dist:
            rows[table].append((k, key, *args))

    if op in UNARY_POINTWISE and len(ins) == 1 and ins[0] == out:
        for a in range(len(out)):
            add("xt1", sig.with_dims([_times(out, a, c)], _times(out, a, c)), a, a)
    elif op in BINARY_POINTWISE and len(ins) == 2 and ins[0] == ins[1] == out:
        for a in range(len(out)):
            t = _times(out, a, c)
            add("xt2", sig.with_dims([t, t], t), a)
    elif op == "reshape" and len(ins) == 1:
        src = ins[0]
        for a in range(len(src)):
            for a2 in range(len(out)):
                if prod(src[:a]) == prod(out[:a2]):
                    add("xt1", sig.with_dims([_times(src, a, c)], _times(out, a2, c)), a, a2)
    elif op == "transpose" and len(ins) == 1:
        perm = _ints(parsed, "dimensions")
        if sorted(perm) == list(range(len(out))):
            for a in range(len(out)):
                a2 = perm.index(a)
                add("xt1", sig.with_dims([_times(ins[0], a, c)], _times(out, a2, c)), a, a2)
    elif op == "broadcast" and len(ins) == 1:
        mapped = _ints(parsed, "dimensions")
        if len(mapped) == len(ins[0]):
            for a, a2 in enumerate(mapped):
                add("xt1", sig.with_dims([_times(ins[0], a, c)], _times(out, a2, c)), a, a2)
            for a2 in range(len(out)):
                if a2 not in mapped:
                    add("xtb", sig.with_dims([ins[0]], _times(out, a2, c)), a2)
    elif op == "dot" and len(ins) == 2:
        lb, lc = _ints(parsed, "lhs_batch_dims"), _ints(parsed, "lhs_contracting_dims")
        rb, rc = _ints(parsed, "rhs_batch_dims"), _ints(parsed, "rhs_contracting_dims")
        lhs, rhs = ins
        lfree = [d for d in range(len(lhs)) if d not in lb and d not in lc]
        rfree = [d for d in range(len(rhs)) if d not in rb and d not in rc]
        for j, a in enumerate(lfree):
            a2 = len(lb) + j
            add("xtdot", sig.with_dims([_times(lhs, a, c), rhs], _times(out, a2, c)), a, a2, 0)
        for j, a in enumerate(rfree):
            a2 = len(lb) + len(lfree) + j
            add("xtdot", sig.with_dims([lhs, _times(rhs, a, c)], _times(out, a2, c)), a, a2, 1)
    elif op == "concatenate" and ins and all(x == ins[0] for x in ins) and len(ins) % c == 0:
        d = _ints(parsed, "dimensions")
        if len(d) != 1:
            return
        n = len(ins) // c
        for a in range(len(out)):
            if a == d[0]:
                continue
            t = _times(ins[0], a, c)
            o = (*t[: d[0]], t[d[0]] * n, *t[d[0] + 1 :])
            dtype = sig.ins[0][0]
            add("xcat", replace(sig, ins=tuple((dtype, t) for _ in range(n)), out=(sig.out[0], o)), d[0], a, n)
