"""Tables of rules/window.egg for a prefix sum (cumsum) along the sharded dim.

``cumwin(k, d, kp)``  baseline reduce-window k (operand, init) with reducer add is the inclusive
                      prefix sum along d (window extent n = the dim's, padding (n-1, 0), stride 1,
                      no dilation) and trivial along every other dim; kp is the same prefix sum of
                      a block of n/c (the rank's reduce-window of its block).
``redadd(k, d)``      reduce k of one array with reducer add over dim d alone (either graph).
``bcastin(k, d)``     broadcast k inserts dim d alone, keeping every operand dim in order.
``sortmoves(k, d, kp)``  baseline stable sort k along one dim other than d (every operand shaped
                      alike): each slice along d sorts on its own; kp sorts a block of n/c.
``sortarray(k)``      that sort has one operand (an array result).
``gtemoves(k, d, kp)``  baseline get-tuple-element k of an array: a block along d is taken alike.
``pmove(k, e, e2)``   distributed broadcast, transpose or unit-dim-only reshape k carries operand
                      dim e whole onto result dim e2 (a value constant along the other dims stays
                      so: a broadcast repeats it, a transpose or unit reshape only relabels).

Side conditions (audit, issue 23): only add prefix sums (reordered sums: integers exact modulo
2^bits, floats real); windows trivial along every other dim, checked field by field; a window
attribute not understood gives no row.
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig, scale

TABLES = ("cumwin", "redadd", "bcastin", "pmove", "sortmoves", "gtemoves", "sortarray")
OPCODES = frozenset({"reduce-window", "reduce", "broadcast", "transpose", "reshape", "sort", "get-tuple-element"})

_TRIVIAL = {"size": "1", "stride": "1", "pad": "0_0", "lhs_dilate": "1", "rhs_dilate": "1", "rhs_reversal": "0"}

Rows = dict[str, list[tuple[object, ...]]]


def instruction_rows(rows: Rows, side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    op, key = ins.opcode, sig.key()
    out = ins.shape
    if op == "sort" and side == "baseline" and opnd and str(ins.parsed.get("is_stable", "")).lower() == "true":
        # A stable sort along e sorts every slice along e on its own.
        along = list(ins.parsed.get("dimensions", []))
        src = opnd[0].dims
        if len(along) == 1 and all(o.dims == src for o in opnd):
            for d, n in enumerate(src):
                if d != along[0] and n % c == 0 and n >= c:
                    si = (*src[:d], n // c, *src[d + 1 :])
                    kp = sig.with_dims([si] * len(opnd)).key() if out.is_tuple else sig.with_dims([si], si).key()
                    rows["sortmoves"].append((key, d, kp))
                    if not out.is_tuple:
                        rows["sortarray"].append((key,))
    elif op == "get-tuple-element" and side == "baseline" and not out.is_tuple:
        for d, n in enumerate(out.dims):
            if n % c == 0 and n >= c:
                rows["gtemoves"].append((key, d, sig.with_dims(None, (*out.dims[:d], n // c, *out.dims[d + 1 :])).key()))
    elif op == "reduce-window" and side == "baseline":
        _cumwin(rows, sig, ins, opnd, c)
    elif op == "reduce" and len(opnd) == 2 and ins.parsed.get("reducer") == "add":
        dims = list(ins.parsed.get("dimensions", []))
        if len(dims) == 1 and opnd[1].dims == ():
            rows["redadd"].append((key, int(dims[0])))
    elif op == "broadcast" and len(opnd) == 1:
        dims = [int(x) for x in ins.parsed.get("dimensions", [])]
        out, src = tuple(ins.shape.dims), tuple(opnd[0].dims)
        if len(out) == len(src) + 1 and dims == sorted(dims) and all(src[i] == out[j] for i, j in enumerate(dims)):
            rows["bcastin"].append((key, next(d for d in range(len(out)) if d not in dims)))
        if side == "distributed" and all(src[i] == out[j] for i, j in enumerate(dims)) and len(dims) == len(src):
            for e, e2 in enumerate(dims):
                rows["pmove"].append((key, e, e2))
    elif op == "transpose" and side == "distributed" and len(opnd) == 1:
        perm = [int(x) for x in ins.parsed.get("dimensions", [])]
        for e2, e in enumerate(perm):
            rows["pmove"].append((key, e, e2))
    elif op == "reshape" and side == "distributed" and len(opnd) == 1:
        src, out = tuple(opnd[0].dims), tuple(ins.shape.dims)
        a = [i for i, n in enumerate(src) if n != 1]
        b = [i for i, n in enumerate(out) if n != 1]
        if [src[i] for i in a] == [out[j] for j in b]:  # only unit dims inserted or removed
            for e, e2 in zip(a, b, strict=True):
                rows["pmove"].append((key, e, e2))


def _cumwin(rows: Rows, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    window = ins.parsed.get("window")
    out = tuple(ins.shape.dims)
    if ins.parsed.get("reducer") != "add" or len(opnd) != 2 or opnd[1].dims != () or tuple(opnd[0].dims) != out or not isinstance(window, dict):
        return
    fields = {str(k): str(v).split("x") for k, v in window.items()}
    if set(fields) - set(_TRIVIAL) or any(len(v) != len(out) for v in fields.values()):
        return
    for d in range(len(out)):
        n, s = out[d], scale(out, d, c)
        if s is None or any(v[e] != _TRIVIAL[f] for f, v in fields.items() for e in range(len(out)) if e != d):
            continue
        want = {"size": str(n), "pad": f"{n - 1}_0"}
        if any(fields.get(f, [_TRIVIAL[f]] * len(out))[d] != want.get(f, _TRIVIAL[f]) for f in _TRIVIAL):
            continue
        if "size" not in fields or "pad" not in fields:
            continue
        w = s[d]
        per = {f: "x".join((str(w) if f == "size" else f"{w - 1}_0") if e == d and f in ("size", "pad") else v[e] for e in range(len(out))) for f, v in fields.items()}
        rows["cumwin"].append((sig.key(), d, sig.with_dims([s, ()], s, window=per).key()))
