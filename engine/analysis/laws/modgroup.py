"""Tables of rules/modgroup.egg: rank groups by remainder (rank r uses block r mod q).

Law (the .egg header states it in full): index_select of a duplicate x with n elements along d
at index r mod n gives rank r block (r mod n) of x (``grpm``); ops acting blockwise keep it
with grp's shape tables; z = K = c/n copies of x joined along d (``.repeat`` / ``jnp.tile``)
then holds x' as its block r along d (``sharded``). Grouped-query attention whose baseline
tiles the KV heads ([kv0, kv1, kv0, kv1]) while rank r picks KV head r % n.

Rows:
``rmodk(t, q, K)``     distributed node t (one int element) equals r mod q on every rank r in
                       [0, c) (K = c / q), checked exactly per rank in its own element type with
                       rankint's evaluator (1 < q < c, q divides c). Only gather indices are
                       evaluated, so programs without an index_select pay a walk only.
``tileof(z, x, d, R)`` baseline node z is R >= 2 copies of x joined along d: a concatenate
                       along d whose operands are all x, or a reshape merging dims (d, d+1) of a
                       broadcast of x that inserts a new dim of extent R at d and keeps x's dims
                       in order around it.

``grsum(z, x, d, form, q, K)`` baseline node z sums the groups of x's dim d (extent c = q·K)
                       that a reshape splits it into: "div" (q, K) summed over K, z[g] = sum_j
                       x[g·K + j] (KV heads interleaved); "mod" (K, q) summed over K, z[g] =
                       sum_j x[j·q + g] (tiled); a reduce-add from a literal zero.

Side conditions: the rank value is evaluated only from the rank (or device id) and literals,
never from an input; a divisor that is not q, a remainder without Python's sign fix-up that
goes negative, a wrap in a narrow type or an elided literal give no row (rankint's evaluator
returns no value or another sequence). The tile row is structural: operands must be the same
node (not merely equal-looking ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...hlo.literals import INT_BITS

if TYPE_CHECKING:
    from ..graph import Graphs, Node

TABLES: tuple[str, ...] = ("rmodk", "tileof", "grsum")

Rows = dict[str, list[tuple[object, ...]]]


def graph_rows(rows: Rows, g: Graphs) -> None:
    c = g.spec.c
    idx = _rank_mod_indices(g, c)
    for gid, q in idx:
        rows["rmodk"].append((gid, q, c // q))
    picks = any(n.side == "distributed" and n.ins.opcode in ("gather", "scatter") for n in g.nodes)
    if not picks:
        return  # no index_select or index_add by a rank group: the rows below would serve nothing
    for node in g.nodes:
        if node.side != "baseline":
            continue
        if idx:
            t = _tile(g, node.gid)
            if t is not None:
                rows["tileof"].extend(_through_transposes(g, node.gid, *t, c))
        s = _group_sum(g, node.gid, c)
        if s is not None:
            rows["grsum"].append((node.gid, *s))


def _group_sum(g: Graphs, gid: int, c: int) -> tuple[int, int, str, int, int] | None:
    """(x, d, form, q, K) when baseline node gid = reduce-add from a literal zero over one of
    the two dims that a reshape splits x's dim d (extent c = q·K) into: over the second
    ((q, K), form "div": z[g] = sum_j x[g·K + j]) or over the first ((K, q), form "mod":
    z[g] = sum_j x[j·q + g]), every other dim kept in place."""
    node = g.nodes[gid]
    ins = node.ins
    if ins.opcode != "reduce" or len(node.operands) != 2 or ins.parsed.get("reducer") != "add":
        return None
    init = g.nodes[node.operands[1]].ins
    if init.opcode != "constant" or (init.literal or "").strip() not in ("0", "0.0", "-0", "false"):
        return None
    dims = [int(v) for v in ins.parsed.get("dimensions", [])]
    y = g.nodes[node.operands[0]]
    if len(dims) != 1 or y.ins.opcode != "reshape" or len(y.operands) != 1:
        return None
    xd, yd = tuple(g.nodes[y.operands[0]].ins.shape.dims), tuple(y.ins.shape.dims)
    for d in range(len(xd)):
        if xd[d] == c and len(yd) == len(xd) + 1 and yd[:d] == xd[:d] and yd[d + 2 :] == xd[d + 1 :] and yd[d] * yd[d + 1] == c:
            if dims[0] == d + 1 and 1 < yd[d] < c:
                return y.operands[0], d, "div", yd[d], yd[d + 1]
            if dims[0] == d and 1 < yd[d + 1] < c:
                return y.operands[0], d, "mod", yd[d + 1], yd[d]
    return None


def _rank_mod_indices(g: Graphs, c: int) -> list[tuple[int, int]]:
    """(gid, q) for the one-element int gather / scatter indices of the distributed graph whose
    value is r mod q on every rank."""
    cands = []
    for node in g.nodes:
        if node.side != "distributed" or node.ins.opcode not in ("gather", "scatter") or len(node.operands) < 2:
            continue
        i = node.operands[1]  # the start index of a gather, the index of a scatter
        shape = g.nodes[i].ins.shape
        if shape.numel == 1 and not shape.is_tuple and shape.dtype in INT_BITS:
            cands.append(i)
    # Only an index computed from the rank can be r mod q: the others are not evaluated (numpy
    # and c evaluations per group cost a large model's check ~10 % of its time).
    if cands:
        readers = _rank_readers(g)
        cands = [i for i in cands if i in readers]
    if not cands or c < 4:
        return []
    from .rankint import MAX_ELEMENTS, _Eval

    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the engine's dependencies
        return []
    seqs: dict[int, list[int | None]] = {i: [] for i in cands}
    for r in range(c):
        per_group = [
            _Eval(np, g, {"rank": r, "device": group[r] if r < len(group) else None}, MAX_ELEMENTS)
            for group in g.spec.groups
        ]
        for i, seq in seqs.items():
            vals = {None if (v := ev.value(i)) is None else int(v.reshape(())) for ev in per_group}
            seq.append(
                vals.pop() if len(vals) == 1 else None
            )  # None: unknown, or depends on the group
    out = []
    for i, seq in seqs.items():
        for q in range(2, c):
            if c % q == 0 and seq == [r % q for r in range(c)]:
                out.append((i, q))
    return out


def _rank_readers(g: Graphs) -> set[int]:
    """The distributed values that read the rank input or a device id (one pass in order)."""
    out: set[int] = set()
    for n in g.nodes:
        if n.side != "distributed":
            continue
        if n.ins.opcode == "parameter":
            if n.ins.name in g.rank_params or n.ins.parsed.get("device_id"):
                out.add(n.gid)
        elif any(o in out for o in n.operands):
            out.add(n.gid)
    return out


def _through_transposes(
    g: Graphs, z: int, y: int, d: int, R: int, c: int
) -> list[tuple[object, ...]]:
    """tileof rows (z, x, dx, R, L, "s:d") for y and every node x that y is a chain of
    baseline transposes of: y = transpose_P(x) (y's dim i is x's dim P[i]), so z = tile_d(y) =
    transpose_P(tile_dx(x)) with dx = P[d], and block r of z along d is transpose_P of block r
    of tile_dx(x) along dx. L is that transpose as a layout of the rank's block (the identity
    for x = y); rows only where x's extent along dx splits into q = c/R blocks."""
    from ..bijection import Layout

    if c % R:
        return []
    q = c // R
    out: list[tuple[object, ...]] = []
    perm: list[int] | None = None  # y's dim i is x's dim perm[i]
    x, perms = y, []
    while True:
        dims = tuple(g.nodes[x].ins.shape.dims)
        dx = d if perm is None else perm[d]
        if dims[dx] % q:
            break
        block = (*dims[:dx], dims[dx] // q, *dims[dx + 1 :])
        if not perms:
            key = "id"
        else:
            lay = Layout.identity(block)
            for p in perms:  # innermost transpose first
                lay = lay.then_dst_transpose(p)
            key = lay.key()
        out.append((z, x, dx, R, key, f"s:{d}"))
        node = g.nodes[x]
        if node.ins.opcode != "transpose" or len(node.operands) != 1 or len(out) > 8:
            break
        p = [int(v) for v in node.ins.parsed.get("dimensions", [])]
        if sorted(p) != list(range(len(dims))):
            break
        perms.insert(0, p)
        perm = [p[i] for i in (perm if perm is not None else range(len(dims)))]
        x = node.operands[0]
    return out


def _tile(g: Graphs, gid: int) -> tuple[int, int, int] | None:
    """(y, d, R) when baseline node gid is R >= 2 copies of node y joined along d. z is reached
    from y by data movement only (reshapes, broadcasts, concatenates of one repeated operand:
    the normalizer may squeeze unit dims in between); the element map is computed on position
    ids, exactly, and compared with the tile's."""
    import numpy as np

    node = g.nodes[gid]
    if node.ins.opcode not in _MOVES or node.ins.shape.numel > _MAX or node.ins.shape.is_tuple:
        return None
    chain = [gid]  # z, then its single (repeated) operand, ...
    while len(chain) < 6:
        n = g.nodes[chain[-1]]
        if n.ins.opcode not in _MOVES or not n.operands or len(set(n.operands)) != 1:
            break
        chain.append(n.operands[0])
    zd = tuple(node.ins.shape.dims)
    for k in range(len(chain) - 1, 0, -1):  # the deepest y first: the longest tile
        y = g.nodes[chain[k]]
        yd = tuple(y.ins.shape.dims)
        if len(yd) != len(zd) or y.ins.shape.is_tuple:
            continue
        diff = [d for d in range(len(yd)) if yd[d] != zd[d]]
        if len(diff) != 1 or yd[diff[0]] == 0 or zd[diff[0]] % yd[diff[0]]:
            continue
        d = diff[0]
        ids = np.arange(y.ins.shape.numel, dtype=np.int64).reshape(yd)
        val = ids
        for j in range(k - 1, -1, -1):
            val = _move(np, g.nodes[chain[j]], val)
            if val is None:
                break
        R = zd[d] // yd[d]
        if (
            val is not None
            and R >= 2
            and val.shape == zd
            and np.array_equal(val, np.concatenate([ids] * R, axis=d))
        ):
            return y.gid, d, R
    return None


_MOVES = frozenset({"reshape", "broadcast", "concatenate", "copy"})
_MAX = 1 << 16


def _move(np: Any, n: Node, x: Any) -> Any:
    """The position ids after data-movement node n (operand value x), or None."""
    ins = n.ins
    dims = tuple(ins.shape.dims)
    if ins.opcode in ("reshape", "copy"):
        return x.reshape(dims)
    if ins.opcode == "concatenate":
        d = list(ins.parsed.get("dimensions", []))
        return np.concatenate([x] * len(n.operands), axis=int(d[0])) if len(d) == 1 else None
    bd = [int(v) for v in ins.parsed.get("dimensions", [])]
    if len(bd) != x.ndim or bd != sorted(bd):
        return None
    shape = [1] * len(dims)
    for i, b in enumerate(bd):
        shape[b] = x.shape[i]
    return np.broadcast_to(x.reshape(shape), dims)
