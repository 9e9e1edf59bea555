"""Tables of rules/rollring.egg: ring buffers of c rows moved by a rank-dependent roll.

JAX users write a ring all-reduce on the chunks as a (c, w) array: ``jnp.roll(chunks, r + 1,
axis=0)`` (a traced shift), ``chunks[::-1]``, ``chunks[k]``, ``chunks.at[k].add(got)``,
``jnp.stack(rows)``, ``lax.dynamic_index_in_dim(chunks, (r - k) % c, 0)``, ``reshape(d)``. These
lower to (jax 0.10):

- ``jnp.roll`` by a traced shift s: ``dynamic-slice(concatenate(a, a), o, 0...)`` along the
  axis, o = n - (s mod n) (Python's mod, with sign fix-ups), sizes = a's shape;
- ``jnp.roll`` by a literal shift: ``concatenate(slice(a, [n-s:n]), slice(a, [0:n-s]))``;
- ``a[::-1]``: ``reverse``; ``a[k]``: ``slice`` (extent 1) + a reshape dropping the unit dim;
  ``a[(r - k) % c]`` / ``dynamic_index_in_dim``: ``dynamic-slice`` (extent 1) at a per-rank start;
- ``a.at[k].add(u)`` / ``.set(u)``: a ``scatter`` at one literal index (add / overwrite);
  ``lax.dynamic_update_index_in_dim``: ``dynamic-update-slice`` at a literal start;
- ``jnp.stack`` of c rows: reshapes adding a unit dim, then ``concatenate``;
- the same on the flat chunk vector: ``jnp.roll(buf, -w * r)``, ``buf[k*w:(k+1)*w]``,
  ``buf.at[k*w:(k+1)*w].add(u)`` (a scatter of one block at start k·w), ``jnp.concatenate``.

Each of these moves whole rows of a buffer B of c rows along d, and is described here by what
row j of its result is on rank r (r = the rank's index in its group; rank-dependent offsets
are evaluated exactly on every device of every group and must agree across groups):

``rvsplit(b, a, d)``        reshape b of a splits a's dim d (extent c·w) into (c, w) at (d, d+1)
``rvmerge(m, b, d)``        reshape m of b merges b's dims (d, d+1) (extent c at d) back
``rvmap(b, a, d, p, s, q)`` row j of b (same shape as a) is row (p·j + s·r + q) mod c of a, for
                            every j and every rank r (reverse: p = c-1, q = c-1; roll: p = 1)
``rvrow(u, b, d, s, q)``    u (b's shape, extent 1 at d) is row (s·r + q) mod c of b
``rvsq(s, u, d)``           reshape s of u drops u's unit dim d (the other dims in order)
``rvex(u, s, d)``           reshape u of s inserts a unit dim at d (the other dims in order)
``rvupd(n, b, u, d, j, kind, unit)``  n is b with row j replaced by u (kind 0) or incremented
                            by u (kind 1, an add of b's element type); unit 1: u has b's shape
                            with extent 1 at d, 0: u is that row with d dropped
``rvcat(n, d, i, u)``       concatenate n along d of c operands of extent 1: row i is u
``rvrows(b, d, j)``         j in [0, c) for a buffer b that a rvupd reads (its rows one by one)
``rvring(c)``               the group size, written once any row above is (the rules that read
                            only derived relations load with it: nothing is loaded otherwise)
``rvflat(a, d)``            a is a flat buffer: extent c·w along d, block j = elements
                            [j·w, (j+1)·w) (``jnp.roll`` of the chunk vector itself by multiples
                            of w); the tables above name its dim d + FLAT (64), so that the facts
                            of a node read as split and as flat never combine
``rvblock(v, d)``           v is one block of a flat buffer (extent w at d): the block itself

Side conditions (soundness first): every offset is an exact integer evaluated per device
(rankint's evaluator: each int type with its wrap) and clamped as XLA clamps dynamic-slice
starts before the row map is read off; a row map is written only when it holds on all c ranks
of every group; the roll's concatenate must be of one operand with itself along the rolled dim;
starts of other dims must be 0 on every rank; rows are extent 1 (a whole-row move), so values
only move (every dtype, NaN included); a buffer's rolled dim must have extent exactly c (the
group size). Only programs that shift a ring (a collective-permute) get rows at all, so other
programs pay one scan of their opcodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...hlo.literals import INT_BITS
from ..scatter import is_overwrite
from .rankint import MAX_ELEMENTS, _Eval

if TYPE_CHECKING:
    from ..graph import Graphs, Node

TABLES = ("rvsplit", "rvmerge", "rvmap", "rvrow", "rvsq", "rvex", "rvupd", "rvcat", "rvrows", "rvring", "rvflat", "rvblock")

Rows = dict[str, list[tuple[object, ...]]]


def _split_dim(src: tuple[int, ...], out: tuple[int, ...], c: int) -> list[int]:
    """Dims d where ``out`` is ``src`` with dim d split into (c, src[d] / c)."""
    found = []
    for d in range(len(src)):
        if len(out) == len(src) + 1 and out[:d] == src[:d] and out[d] == c and out[d] * out[d + 1] == src[d] and out[d + 2 :] == src[d + 1 :]:
            found.append(d)
    return found


def _unit_dim(src: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Dims d where ``out`` is ``src`` with a unit dim inserted at d."""
    return [d for d in range(len(out)) if out[d] == 1 and out[:d] + out[d + 1 :] == src]


def _whole_but(sizes: list[int], dims: tuple[int, ...], d: int, n: int) -> bool:
    return len(sizes) == len(dims) and sizes[d] == n and all(s == m for i, (s, m) in enumerate(zip(sizes, dims, strict=True)) if i != d)


def _row_form(seq: list[int], c: int) -> tuple[int, int] | None:
    """(s, q) in [0, c) with seq[r] == (s·r + q) mod c for every rank r, or None."""
    if len(seq) != c or any(not 0 <= v < c for v in seq):
        return None
    q = seq[0]
    s = (seq[1] - q) % c if c > 1 else 0
    return (s, q) if all(v == (s * r + q) % c for r, v in enumerate(seq)) else None


class _PerRank:
    """Exact per-rank values of rank-dependent scalars (rankint's evaluator), agreed across
    every group's device r; None when a value is unknown on some device or differs between
    groups (a function of the group, not of the rank)."""

    def __init__(self, g: Graphs) -> None:
        import numpy as np

        self.np = np
        self.evals = [[_Eval(np, g, {"rank": r, "device": grp[r] if r < len(grp) else None}, MAX_ELEMENTS) for grp in g.spec.groups] for r in range(g.spec.c)]

    def array(self, gid: int) -> list[Any] | None:
        """The value of ``gid`` on rank r (agreed across groups), for every r, or None."""
        out: list[Any] = []
        for per_group in self.evals:
            vals = [_with_reduces(self.np, ev, gid) for ev in per_group]
            if any(v is None for v in vals) or any(not self.np.array_equal(vals[0], v) for v in vals[1:]):
                return None
            out.append(vals[0])
        return out

    def scalar(self, gid: int) -> list[int] | None:
        out: list[int] = []
        for per_group in self.evals:
            vals = set()
            for ev in per_group:
                v = ev.value(gid)
                if v is None or getattr(v, "size", 0) != 1:
                    return None
                vals.add(int(v.reshape(())))
            if len(vals) != 1:
                return None
            out.append(vals.pop())
        return out


def _with_reduces(np: Any, ev: _Eval, gid: int) -> Any:
    """``ev.value(gid)``, also through ``reduce`` of pred values with ``and`` / ``or`` (``jnp.take``'s
    in-bounds mask: every index vector component within bounds), evaluated here in operand order
    and handed to the evaluator as known values."""
    g = ev.g
    seen: set[int] = set()
    stack, reduces = [gid], []
    while stack:
        top = stack.pop()
        if top in seen or top in ev.memo:
            continue
        seen.add(top)
        n = g.nodes[top]
        if n.ins.opcode == "reduce" and n.ins.shape.dtype == "pred" and n.ins.parsed.get("reducer") in ("and", "or") and len(n.operands) == 2:
            reduces.append(top)
        if n.ins.shape.dtype == "pred" or n.ins.shape.dtype in INT_BITS:
            stack.extend(n.operands)
    for r in sorted(reduces):  # operands before users (ids follow the program order)
        n = g.nodes[r]
        x, init = ev.value(n.operands[0]), ev.value(n.operands[1])
        dims = tuple(int(v) for v in n.ins.parsed.get("dimensions", []))
        if x is None or init is None or init.shape != () or x.dtype != np.bool_:
            ev.memo[r] = None
            continue
        f = np.all if n.ins.parsed.get("reducer") == "and" else np.any
        red = f(x, axis=dims) if dims else x
        ev.memo[r] = np.logical_and(red, init) if n.ins.parsed.get("reducer") == "and" else np.logical_or(red, init)
    return ev.value(gid)


FLAT = 64  # d + FLAT keys a flat buffer's facts (see the module docstring)


def graph_rows(rows: Rows, g: Graphs) -> None:
    c = g.spec.c
    if c < 2 or not any(i.opcode == "collective-permute" for i in g.distributed.entry.instructions):
        return  # no ring: these laws never apply (the gate of the family)
    dist = [n for n in g.nodes if n.side == "distributed"]
    if not any(n.ins.opcode in ("reshape", "concatenate") for n in dist):
        return
    users: dict[int, list[Node]] = {}
    for n in dist:
        for o in n.operands:
            users.setdefault(o, []).append(n)
    shape = lambda gid: tuple(g.nodes[gid].ins.shape.dims)  # noqa: E731
    per_rank: list[_PerRank] = []

    def values(gid: int) -> list[int] | None:
        if not per_rank:
            per_rank.append(_PerRank(g))
        return per_rank[0].scalar(gid)

    def per_rank_array(gid: int) -> list[Any] | None:
        if not per_rank:
            per_rank.append(_PerRank(g))
        return per_rank[0].array(gid)

    # Buffers (gid, key): key d for a split buffer (extent c at d, blocks of one index), d + FLAT
    # for a flat one (extent c·w at d, blocks of w): reached from a split reshape, a stack of c
    # rows, or the operand of a roll.
    buffers: set[tuple[int, int]] = set()
    todo: list[tuple[int, int]] = []

    def buffer(gid: int, key: int) -> None:
        if (gid, key) not in buffers:
            buffers.add((gid, key))
            todo.append((gid, key))
            if key >= FLAT:
                rows["rvflat"].append((gid, key - FLAT))

    for n in dist:
        ins = n.ins
        if ins.shape.is_tuple or not n.operands:
            continue
        if ins.opcode == "reshape":
            for d in _split_dim(shape(n.operands[0]), tuple(ins.shape.dims), c):
                rows["rvsplit"].append((n.gid, n.operands[0], d))
                buffer(n.gid, d)
        elif ins.opcode == "concatenate" and len(n.operands) == c:
            d = int(ins.parsed.get("dimensions", [-1])[0])
            ext = {shape(o)[d] for o in n.operands} if 0 <= d < ins.shape.rank else set()
            if len(ext) == 1 and ins.shape.dims[d] == c * min(ext):
                if ext == {1}:  # a stack of c rows (a unit dim inserted at d): split form
                    for i, o in enumerate(n.operands):
                        rows["rvcat"].append((n.gid, d, i, o))
                        _unit_source(rows, g, o, d)
                    buffer(n.gid, d)
                for i, o in enumerate(n.operands):  # c blocks joined: flat form
                    rows["rvcat"].append((n.gid, d + FLAT, i, o))
                    rows["rvblock"].append((o, d))
                buffer(n.gid, d + FLAT)
        if ins.opcode == "concatenate" and len(n.operands) == 2 and n.operands[0] == n.operands[1]:
            d = int(ins.parsed.get("dimensions", [-1])[0])
            a = n.operands[0]
            if 0 <= d < ins.shape.rank and shape(a)[d] % c == 0 and any(u.ins.opcode == "dynamic-slice" for u in users.get(n.gid, [])):
                buffer(a, d + FLAT)  # a rolled as a whole: its own blocks (rvflat)
    while todo:
        b, key = todo.pop()
        d, flat = key % FLAT, key >= FLAT
        dims = shape(b)
        w = dims[d] // c if flat else 1  # the extent of one block along d
        for u in users.get(b, []):
            ins, op = u.ins, u.ins.opcode
            if op == "reverse" and [int(x) for x in ins.parsed.get("dimensions", [])] == [d] and w == 1:
                rows["rvmap"].append((u.gid, b, key, c - 1, 0, c - 1))
                buffer(u.gid, key)
            elif op == "reshape" and not flat and len(dims) == ins.shape.rank + 1 and tuple(ins.shape.dims) == (*dims[:d], dims[d] * dims[d + 1], *dims[d + 2 :]):
                rows["rvmerge"].append((u.gid, b, d))
            elif op == "concatenate" and u.operands and all(o == b for o in u.operands):
                for ds in users.get(u.gid, []):
                    _dynamic_roll(rows, ds, u, b, dims, key, w, c, values, buffer)
            elif op == "slice":
                for cat in users.get(u.gid, []):
                    if cat.ins.opcode == "concatenate":
                        _static_roll(rows, g, cat, key, w, c, buffer)
                sl = ins.parsed.get("slice") or []
                if len(sl) == len(dims) and all(int(st) == 1 for _, _, st in sl) and int(sl[d][1]) - int(sl[d][0]) == w and int(sl[d][0]) % w == 0 and all(
                        int(a) == 0 and int(e) == m for i, ((a, e, _), m) in enumerate(zip(sl, dims, strict=True)) if i != d):
                    rows["rvrow"].append((u.gid, b, key, 0, int(sl[d][0]) // w))
                    _unit(rows, users, u, key)
            elif op == "dynamic-slice" and u.operands[0] == b:
                sizes = [int(x) for x in ins.parsed.get("dynamic_slice_sizes", [])]
                if _whole_but(sizes, dims, d, w) and len(u.operands) == 1 + len(dims):
                    form = _start_form(u.operands[1:], d, w, c, values)
                    if form is not None:
                        rows["rvrow"].append((u.gid, b, key, *form))
                        _unit(rows, users, u, key)
            elif op == "dynamic-update-slice" and u.operands[0] == b and len(u.operands) == 2 + len(dims):
                if _whole_but(list(shape(u.operands[1])), dims, d, w):
                    form = _start_form(u.operands[2:], d, w, c, values)
                    if form is not None and form[0] == 0:
                        _update(rows, g, u, b, u.operands[1], key, form[1], 0, 1, c, buffer)
            elif op == "gather" and u.operands[0] == b and len(u.operands) == 2 and w == 1:
                _gather(rows, g, u, b, key, c, per_rank_array, buffer)
            elif op == "select" and len(u.operands) == 3 and u.operands[1] == b and tuple(u.ins.shape.dims) == dims:
                seq = per_rank_array(u.operands[0])
                if seq is not None and all(bool(v.all()) for v in seq):  # the fill is never chosen
                    rows["rvmap"].append((u.gid, b, key, 1, 0, 0))
                    buffer(u.gid, key)
            elif op == "scatter" and u.operands[0] == b and len(u.operands) == 3:
                _scatter(rows, g, u, b, key, w, c, values, buffer)
    # A node read as one flat block (its row 0 is all of it) must never share an e-class with a
    # flat buffer of c blocks along the same dim: both readings use the key d + 64, so a row-0
    # fact of one would be read by the other (tests/soundness_regressions/
    # flat_block_read_as_ring_buffer). Nodes of one class have one shape, and rules merge
    # distinct nodes (x + 0, a full slice, ...), so a block whose shape along d is a buffer's
    # (concatenate(a, a) at c = 2, or an alias of a buffer) keeps no block reading: no rvblock
    # row, and no join, update or block-taken-out row reads it as one block.
    flat_shapes = {(shape(b), k - FLAT) for b, k in buffers if k >= FLAT}
    both = {(u, d) for u, d in rows["rvblock"] if (shape(int(u)), d) in flat_shapes}  # type: ignore[call-overload]
    if both:
        rows["rvblock"] = [r for r in rows["rvblock"] if r not in both]
        rows["rvcat"] = [r for r in rows["rvcat"] if not (int(r[1]) >= FLAT and (r[3], int(r[1]) - FLAT) in both)]  # type: ignore[call-overload]
        rows["rvupd"] = [r for r in rows["rvupd"] if not (int(r[3]) >= FLAT and r[6] and (r[2], int(r[3]) - FLAT) in both)]  # type: ignore[call-overload]
        rows["rvrow"] = [r for r in rows["rvrow"] if not (int(r[2]) >= FLAT and (r[0], int(r[2]) - FLAT) in both)]  # type: ignore[call-overload]
    if buffers:
        rows["rvring"].append((c,))


def _unit_source(rows: Rows, g: Graphs, u: int, d: int) -> None:
    n = g.nodes[u]
    if n.ins.opcode == "reshape" and len(n.operands) == 1:
        for e in _unit_dim(tuple(g.nodes[n.operands[0]].ins.shape.dims), tuple(n.ins.shape.dims)):
            if e == d:
                rows["rvex"].append((u, n.operands[0], d))


def _unit(rows: Rows, users: dict[int, list[Any]], u: Any, key: int) -> None:
    """One block taken out of a buffer: a flat buffer's block is the block itself (rvblock); a
    split buffer's row leaves through a reshape dropping its unit dim (rvsq)."""
    if key >= FLAT:
        rows["rvblock"].append((u.gid, key - FLAT))
        return
    dims = tuple(u.ins.shape.dims)
    for s in users.get(u.gid, []):
        if s.ins.opcode == "reshape" and tuple(s.ins.shape.dims) == dims[:key] + dims[key + 1 :]:
            rows["rvsq"].append((s.gid, u.gid, key))


def _start_form(starts: list[int], d: int, w: int, c: int, values: Any) -> tuple[int, int] | None:
    """(s, q): the start along d is w·((s·r + q) mod c) on every rank after XLA's clamp to
    [0, (c - 1)·w]; the starts of the other dims are 0 on every rank."""
    form: tuple[int, int] | None = None
    for i, st in enumerate(starts):
        seq = values(st)
        if seq is None:
            return None
        seq = [min(max(v, 0), (c - 1) * w) for v in seq]  # XLA clamps starts into the operand
        if i != d and any(v != 0 for v in seq):
            return None
        if i == d:
            if any(v % w for v in seq):
                return None
            form = _row_form([v // w for v in seq], c)
    return form


def _dynamic_roll(rows: Rows, ds: Any, cat: Any, a: int, a_dims: tuple[int, ...], key: int, w: int, c: int, values: Any, buffer: Any) -> None:
    """``dynamic-slice(concatenate(a, a) along d, starts)`` of a's shape: block j is block
    (j + o / w) mod c of a, o the start along d clamped to [0, c·w] (a multiple of w)."""
    ins = cat.ins
    d = key % FLAT
    if len(cat.operands) != 2 or int(ins.parsed.get("dimensions", [-1])[0]) != d:
        return
    if ds.ins.opcode != "dynamic-slice" or ds.operands[0] != cat.gid or len(ds.operands) != 1 + ds.ins.shape.rank:
        return
    dims = tuple(ds.ins.shape.dims)
    if dims != tuple(a_dims) or [int(x) for x in ds.ins.parsed.get("dynamic_slice_sizes", [])] != list(dims):
        return  # the window is a's whole shape: every block whole, c of them
    n = c * w
    offs: list[int] = []
    for i, st in enumerate(ds.operands[1:]):
        seq = values(st)
        if seq is None:
            return
        seq = [min(max(v, 0), (2 * n if i == d else dims[i]) - dims[i]) for v in seq]
        if i != d and any(v != 0 for v in seq):
            return
        if i == d:
            if any(v % w for v in seq):
                return  # not a whole number of blocks
            offs = [(v // w) % c for v in seq]
    form = _row_form(offs, c)
    if form is None:
        return
    rows["rvmap"].append((ds.gid, a, key, 1, *form))
    buffer(ds.gid, key)


def _static_roll(rows: Rows, g: Graphs, cat: Any, key: int, w: int, c: int, buffer: Any) -> None:
    """A concatenate along d of literal slices of one buffer (whole along every other dim), each
    whole blocks: ``jnp.roll`` by a literal shift. Block j is block (p·j + q) mod c, p = 1 or c - 1."""
    ins = cat.ins
    d = key % FLAT
    if int(ins.parsed.get("dimensions", [-1])[0]) != d or tuple(ins.shape.dims)[d] != c * w:
        return
    src: list[int] = []
    base: int | None = None
    for o in cat.operands:
        n = g.nodes[o]
        sl = n.ins.parsed.get("slice") or []
        if n.ins.opcode != "slice" or len(n.operands) != 1 or (base is not None and n.operands[0] != base):
            return
        base = n.operands[0]
        dims = tuple(g.nodes[base].ins.shape.dims)
        if len(sl) != len(dims) or dims != tuple(ins.shape.dims) or any(int(st) != 1 for _, _, st in sl):
            return
        if any(int(a) != 0 or int(e) != m for i, ((a, e, _), m) in enumerate(zip(sl, dims, strict=True)) if i != d):
            return
        lo, hi = int(sl[d][0]), int(sl[d][1])
        if lo % w or hi % w:
            return
        src.extend(range(lo // w, hi // w))
    if base is None or len(src) != c:
        return
    for p in (1, c - 1):
        q = src[0]
        if all(v == (p * j + q) % c for j, v in enumerate(src)):
            rows["rvmap"].append((cat.gid, base, key, p, 0, q))
            buffer(cat.gid, key)
            return


def _update(rows: Rows, g: Graphs, n: Any, b: int, u: int, key: int, j: int, kind: int, unit: int, c: int, buffer: Any) -> None:
    rows["rvupd"].append((n.gid, b, u, key, j, kind, unit))
    rows["rvrows"].extend((b, key, k) for k in range(c))
    if unit and key >= FLAT:
        rows["rvblock"].append((u, key - FLAT))
    elif unit:
        _unit_source(rows, g, u, key)
    buffer(n.gid, key)


def _scatter(rows: Rows, g: Graphs, n: Any, b: int, key: int, w: int, c: int, values: Any, buffer: Any) -> None:
    """``a.at[j].add(u)`` / ``.set(u)`` (one literal index j into dim d, the update a whole row),
    or of a flat buffer ``a.at[j*w:(j+1)*w].add(u)`` (start j·w, the update one whole block)."""
    p = n.ins.parsed
    d = key % FLAT
    reducer = p.get("reducer")
    kind = 1 if reducer == "add" else 0 if is_overwrite(reducer) else -1
    if kind < 0 or p.get("input_batching_dims") or p.get("scatter_indices_batching_dims"):
        return
    dims = tuple(n.ins.shape.dims)
    idx, upd = n.operands[1], n.operands[2]
    idims, udims = tuple(g.nodes[idx].ins.shape.dims), tuple(g.nodes[upd].ins.shape.dims)
    try:
        uwd = [int(x) for x in p.get("update_window_dims", [])]
        iwd = [int(x) for x in p.get("inserted_window_dims", [])]
        sdo = [int(x) for x in p.get("scatter_dims_to_operand_dims", [])]
        ivd = int(p["index_vector_dim"])
    except (KeyError, TypeError, ValueError):
        return
    if sdo != [d] or g.nodes[upd].ins.shape.dtype != n.ins.shape.dtype:
        return
    if idims not in ((), (1,)) or ivd != 0:
        return  # one index vector of one component
    seq = values(idx)
    if seq is None or len(set(seq)) != 1 or not 0 <= seq[0] < c * w or seq[0] % w:
        return  # the same literal block on every rank, inside the buffer (XLA drops others)
    j = seq[0] // w
    rest = dims[:d] + dims[d + 1 :]
    if key < FLAT and iwd == [d] and udims == rest and uwd == list(range(len(rest))):
        _update(rows, g, n, b, upd, key, j, kind, 0, c, buffer)
    elif not iwd and udims == (*dims[:d], w, *dims[d + 1 :]) and uwd == list(range(len(dims))):
        _update(rows, g, n, b, upd, key, j, kind, 1, c, buffer)


def _gather(rows: Rows, g: Graphs, n: Any, b: int, key: int, c: int, arrays: Any, buffer: Any) -> None:
    """``jnp.take(a, idx, axis=d)`` / ``a[idx]`` of whole rows: a gather whose result has a's
    shape, row j = row idx[j] of a (XLA clamps each start into [0, c - 1]), idx evaluated per rank."""
    p = n.ins.parsed
    d = key % FLAT
    dims = tuple(g.nodes[b].ins.shape.dims)
    idims = tuple(g.nodes[n.operands[1]].ins.shape.dims)
    try:
        offset = [int(x) for x in p.get("offset_dims", [])]
        collapsed = [int(x) for x in p.get("collapsed_slice_dims", [])]
        smap = [int(x) for x in p.get("start_index_map", [])]
        sizes = [int(x) for x in p.get("slice_sizes", [])]
        ivd = int(p["index_vector_dim"])
    except (KeyError, TypeError, ValueError):
        return
    if p.get("operand_batching_dims") or p.get("start_indices_batching_dims") or tuple(n.ins.shape.dims) != dims:
        return
    if collapsed != [d] or smap != [d] or sizes != [1 if i == d else m for i, m in enumerate(dims)]:
        return
    if offset != [i for i in range(len(dims)) if i != d] or idims not in ((c, 1), (c,)) or ivd != 1:
        return
    seq = arrays(n.operands[1])
    if seq is None:
        return
    src = [[min(max(int(v), 0), c - 1) for v in a.reshape(-1)] for a in seq]  # XLA clamps starts
    q = src[0][0]
    s = (src[1][0] - q) % c
    for p_ in (1, c - 1):
        if all(src[r][j] == (p_ * j + s * r + q) % c for r in range(c) for j in range(c)):
            rows["rvmap"].append((n.gid, b, key, p_, s, q))
            buffer(n.gid, key)
            return
