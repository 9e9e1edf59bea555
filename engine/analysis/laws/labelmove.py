"""Tables of rules/labelmove.egg: data movement through collectives evaluated per rank on labels.

Law: reshape, transpose, copy, slice, concatenate, broadcast and the movement collectives
(all-to-all, all-gather, collective-permute) compute nothing: each output element is one input
element (or, for a permute's non-receiving rank, a zero). Take a distributed tensor X that a
chain of such ops (with at least one collective) moves to O. Suppose X is block r along e of
some tensor T on rank r (sharded), or T itself on every rank (duplicate). Label T's elements
0..N-1, give every device its rank's labels of X, and run the chain on the labels on every
device, with the collectives' real groups and member order. If O's labels are block r along e2
of T's labels on every device (or all of T on every device), O's values are too, whatever T
holds: O is T sharded along e2 (or a duplicate of T), by the relation X has.

Tables (node ids; each row checked on every device, element by element):

- ``lmss(x, e, o, e2)``  X block r along e of T  =>  O block r along e2 of T;
- ``lmsd(x, e, o)``      X block r along e of T  =>  O is T;
- ``lmds(x, o, e2)``     X is T                   =>  O block r along e2 of T;
- ``lmdd(x, o)``         X is T                   =>  O is T (through a collective);
- ``lmsst(x, e, s, o, e2, b0, bd)``  X the r-th piece of each block of T along e (s = "" one
  contiguous split, or core.egg's blocks form "b,b,.."), T = baseline node b0 (its shape)
  =>  O block r along e2 of baseline node bd, which a chain of baseline moves makes of b0
  (the same labels moved by the baseline's own ops).

Side conditions: every collective on the chain has exactly the sharding groups (as sets; the
members' order is followed), so no value crosses into a group holding other data; every op on
the chain reads only X's labels (one source); a non-receiving rank's label -1 matches no label of
T; at most MAX_ELEMENTS labels per tensor; every dtype (values only move: NaN, -0.0 and wrap
alike).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...ir import Instruction
    from ..graph import Graphs

TABLES = ("lmss", "lmsd", "lmds", "lmdd", "lmsst")
MAX_ELEMENTS = 1 << 16
MOVES = frozenset({"reshape", "transpose", "copy", "slice", "concatenate", "broadcast", "bitcast"})
COLLECTIVES = frozenset({"all-to-all", "all-gather", "collective-permute"})

Rows = dict[str, list[tuple[object, ...]]]


def graph_rows(rows: Rows, g: Graphs) -> None:
    dist = [n for n in g.nodes if n.side == "distributed"]
    if not any(n.ins.opcode in COLLECTIVES for n in dist):
        return
    # Equal computations are one value (the e-graph's terms are hash-consed alike): a chain that
    # joins copies of one piece (XLA's compiled tuple all-to-all slices one tensor four times)
    # reads one source.
    canon: dict[int, int] = {}
    seen_terms: dict[tuple[object, ...], int] = {}
    for n in dist:
        term = (n.sig.key(), *(canon.get(o, o) for o in n.operands)) if n.sig is not None and n.operands else None
        canon[n.gid] = seen_terms.setdefault(term, n.gid) if term is not None else n.gid
    users: dict[int, list[int]] = {}
    for n in dist:
        if canon[n.gid] != n.gid:
            continue
        for o in dict.fromkeys(canon.get(o, o) for o in n.operands):
            users.setdefault(o, []).append(n.gid)
    movable = {n.gid for n in dist if (n.ins.opcode in MOVES and not n.ins.shape.is_tuple) or (n.ins.opcode in COLLECTIVES and len(n.operands) == 1 and not n.ins.shape.is_tuple)
               or _tuple_a2a(n.ins) or (n.ins.opcode == "get-tuple-element" and n.operands and _tuple_a2a(g.nodes[n.operands[0]].ins))}

    def reaches_collective(x: int) -> bool:
        seen, todo = set(), [x]
        while todo:
            y = todo.pop()
            for u in users.get(y, []):
                if u in movable and u not in seen:
                    if g.nodes[u].ins.opcode in COLLECTIVES:
                        return True
                    seen.add(u)
                    todo.append(u)
        return False

    # Sources: every value (an input, a dot, or a move of one: whichever the rules relate) that a
    # chain of moves brings to a collective.
    # (Small values only, checked first: production-sized programs pay one pass over the nodes.)
    c = g.spec.c
    sources = [n.gid for n in dist if canon[n.gid] == n.gid and n.ins.opcode not in COLLECTIVES and not n.ins.shape.is_tuple and 0 < n.ins.shape.numel * c <= MAX_ELEMENTS and reaches_collective(n.gid)]
    if not sources:
        return
    import numpy as np

    groups = [list(x) for x in g.spec.groups]
    devices = [d for grp in groups for d in grp]
    rank_of = {d: i for grp in groups for i, d in enumerate(grp)}
    base_users: dict[int, list[int]] = {}
    base_by_shape: dict[tuple[int, ...], list[int]] = {}
    for n in g.nodes:
        if n.side != "baseline" or n.ins.shape.is_tuple:
            continue
        base_by_shape.setdefault(tuple(n.ins.shape.dims), []).append(n.gid)
        if n.ins.opcode in MOVES and len(n.operands) == 1:
            base_users.setdefault(n.operands[0], []).append(n.gid)
    base_labels: dict[tuple[int, ...], list[tuple[int, int, Any]]] = {}

    def moved_in_baseline(shape: tuple[int, ...], t: Any) -> list[tuple[int, int, Any]]:
        """(b0, bd, labels): every baseline node b0 of T's shape and each node bd a chain of
        baseline moves takes it to (b0 itself included), with T's labels moved alike."""
        if shape not in base_labels:
            out: list[tuple[int, int, Any]] = []
            for b0 in base_by_shape.get(shape, [])[:64]:
                vals = {b0: t}
                for u in sorted(_descendants(base_users, set(base_users_all), b0)):
                    n = g.nodes[u]
                    if n.operands and n.operands[0] in vals:
                        v = _move(np, n.ins, [vals[n.operands[0]]])
                        if v is not None:
                            vals[u] = v
                out.extend((b0, bd, v) for bd, v in vals.items())
            base_labels[shape] = out
        return base_labels[shape]

    base_users_all = {u for us in base_users.values() for u in us}
    for x in dict.fromkeys(sources):
        shape = tuple(g.nodes[x].ins.shape.dims)
        # -1: X is T on every rank (duplicate); (e, k): X is the r-th piece of each of k equal
        # blocks of T along e (k = 1: one contiguous split; k > 1: core.egg's blocks form
        # "b,b,..", e.g. a flattened (batch, sequence) dim whose sequence is split).
        starts = [(-1, 1)] + [(d, k) for d in range(len(shape)) for k in range(1, min(shape[d], 16) + 1) if shape[d] % k == 0]
        for e, k in starts:
            big = list(shape)
            if e >= 0:
                big[e] *= c
            if int(np.prod(big, dtype=np.int64)) > MAX_ELEMENTS:
                continue
            t = np.arange(int(np.prod(big, dtype=np.int64)), dtype=np.int64).reshape(big)
            if e < 0:
                start = {d: t for d in devices}
            else:
                w = shape[e] // k  # the rank's piece of each block; blocks of c*w
                start = {d: np.take(t, [b * c * w + rank_of[d] * w + i for b in range(k) for i in range(w)], axis=e) for d in devices}
            for o, vals in _run(np, g, users, movable, canon, x, start, groups).items():
                if k == 1 and _relate(np, rows, x, e, o, vals, t, devices, groups):
                    continue
                if e >= 0:
                    blocks = "" if k == 1 else ",".join([str(c * w)] * k)
                    _relate_moved(np, rows, x, e, blocks, o, vals, moved_in_baseline(tuple(big), t), devices, groups)


def _run(np: Any, g: Graphs, users: dict[int, list[int]], movable: set[int], canon: dict[int, int], x: int, start: dict[int, Any], groups: list[list[int]]) -> dict[int, dict[int, Any]]:
    """Per-device labels of the nodes moved from ``x`` alone, for those after a collective
    (nodes by their canonical representative)."""
    vals: dict[int, dict[int, Any]] = {x: start}
    through: set[int] = set()
    order = sorted(_descendants(users, movable, x))
    for u in order:  # gids are in program order: operands first
        n = g.nodes[u]
        opnds = [canon.get(o, o) for o in n.operands]
        if any(o not in vals for o in opnds) or n.ins.shape.numel > MAX_ELEMENTS:
            continue
        if _tuple_a2a(n.ins):
            per = _tuple_all_to_all(n.ins, [vals[o] for o in opnds], groups)
            if per is None:
                continue
        elif n.ins.opcode == "get-tuple-element":
            i = n.ins.tuple_index
            per = {d: v[i] for d, v in vals[opnds[0]].items()} if i is not None else None
            if per is None or any(v.shape != tuple(n.ins.shape.dims) for v in per.values()):
                continue
            through.add(u)
        elif n.ins.opcode in COLLECTIVES:
            per = _collective(np, n.ins, vals[opnds[0]], groups)
            if per is None:
                continue
            through.add(u)
        else:
            per = {}
            for d in start:
                v = _move(np, n.ins, [vals[o][d] for o in opnds])
                if v is None:
                    break
                per[d] = v
            else:
                if any(o in through for o in opnds):
                    through.add(u)
            if len(per) != len(start):
                continue
        vals[u] = per
    return {u: vals[u] for u in through}


def _descendants(users: dict[int, list[int]], movable: set[int], x: int) -> set[int]:
    seen: set[int] = set()
    todo = [x]
    while todo:
        y = todo.pop()
        for u in users.get(y, []):
            if u in movable and u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _relate(np: Any, rows: Rows, x: int, e: int, o: int, vals: dict[int, Any], t: Any, devices: list[int], groups: list[list[int]]) -> bool:
    """Rows for O against T itself; whether one was written."""
    if all(vals[d].shape == t.shape and np.array_equal(vals[d], t) for d in devices):
        if e < 0:
            rows["lmdd"].append((x, o))
        else:
            rows["lmsd"].append((x, e, o))
        return True
    found = False
    for e2 in range(vals[devices[0]].ndim):
        try:
            wholes = [np.concatenate([vals[d] for d in grp], axis=e2) for grp in groups]
        except ValueError:
            continue
        if all(w.shape == t.shape and np.array_equal(w, t) for w in wholes):
            found = True
            if e < 0:
                rows["lmds"].append((x, o, e2))
            else:
                rows["lmss"].append((x, e, o, e2))
    return found


def _relate_moved(np: Any, rows: Rows, x: int, e: int, blocks: str, o: int, vals: dict[int, Any], moved: list[tuple[int, int, Any]], devices: list[int], groups: list[list[int]]) -> None:
    """lmsst: O is block r along e2 of a baseline move bd of b0 (b0 of T's shape), by labels."""
    for e2 in range(vals[devices[0]].ndim):
        try:
            wholes = [np.concatenate([vals[d] for d in grp], axis=e2) for grp in groups]
        except ValueError:
            continue
        for b0, bd, lab in moved:
            if all(w.shape == lab.shape and np.array_equal(w, lab) for w in wholes):
                rows["lmsst"].append((x, e, blocks, o, e2, b0, bd))


def _move(np: Any, ins: Instruction, xs: list[Any]) -> Any:
    dims = tuple(ins.shape.dims)
    p = ins.parsed
    op = ins.opcode
    try:
        if op in ("reshape", "copy", "bitcast"):
            return xs[0].reshape(dims) if xs[0].size == ins.shape.numel else None
        if op == "transpose":
            return np.ascontiguousarray(np.transpose(xs[0], [int(v) for v in p.get("dimensions", [])]))
        if op == "slice":
            sl = p.get("slice")
            return np.ascontiguousarray(xs[0][tuple(slice(a, b, s) for a, b, s in sl)]) if sl else None
        if op == "concatenate":
            return np.concatenate(xs, axis=int(p.get("dimensions", [0])[0]))
        if op == "broadcast":
            bd = [int(v) for v in p.get("dimensions", [])]
            x = xs[0]
            if len(bd) != x.ndim or bd != sorted(bd):
                return None
            shape = [1] * len(dims)
            for i, d in enumerate(bd):
                shape[d] = x.shape[i]
            return np.broadcast_to(x.reshape(shape), dims).copy()
    except (ValueError, TypeError, IndexError):
        return None
    return None


def _tuple_a2a(ins: Instruction) -> bool:
    return ins.opcode == "all-to-all" and ins.shape.is_tuple and not ins.parsed.get("dimensions")


def _tuple_all_to_all(ins: Instruction, xs: list[dict[int, Any]], groups: list[list[int]]) -> dict[int, Any] | None:
    """Tuple all-to-all over the sharding groups: the member at index j receives operand j of
    every member, at tuple index = the sender's index (a per-device list of arrays)."""
    rg = ins.parsed.get("replica_groups")
    if not rg or sorted(sorted(int(v) for v in grp) for grp in rg) != sorted(sorted(grp) for grp in groups):
        return None
    out: dict[int, Any] = {}
    for grp in rg:
        members = [int(v) for v in grp]
        if len(xs) != len(members):
            return None
        for j, m in enumerate(members):
            out[m] = [xs[j][src] for src in members]
    return out


def _collective(np: Any, ins: Instruction, x: dict[int, Any], groups: list[list[int]]) -> dict[int, Any] | None:
    """The per-device labels after an array all-to-all / all-gather / collective-permute whose
    groups are exactly the sharding groups (None for anything else)."""
    op = ins.opcode
    p = ins.parsed
    out: dict[int, Any] = {}
    if op == "collective-permute":
        pairs = [(int(a), int(b)) for a, b in (p.get("source_target_pairs") or [])]
        where = {d: i for i, grp in enumerate(groups) for d in grp}
        if any(a not in where or b not in where or where[a] != where[b] for a, b in pairs):
            return None
        for d in x:
            out[d] = np.full_like(x[d], -1)
        for a, b in pairs:
            out[b] = x[a]
        return out
    rg = p.get("replica_groups")
    if not rg or sorted(sorted(int(v) for v in grp) for grp in rg) != sorted(sorted(grp) for grp in groups):
        return None
    dims = [int(v) for v in p.get("dimensions", [])]
    if len(dims) != 1:
        return None
    d = dims[0]
    for grp in rg:
        members = [int(v) for v in grp]
        k = len(members)
        if op == "all-gather":
            whole = np.concatenate([x[m] for m in members], axis=d)
            for m in members:
                out[m] = whole
        else:  # all-to-all, array form: piece j along d goes to the j-th member
            if x[members[0]].shape[d] % k:
                return None
            for j, m in enumerate(members):
                out[m] = np.concatenate([np.array_split(x[src], k, axis=d)[j] for src in members], axis=d)
    if tuple(next(iter(out.values())).shape) != tuple(ins.shape.dims):
        return None
    return out
