"""Random inputs that satisfy the relations document's input entries.

``groups``: rank groups whose union is ``0..N-1``; rank r of a group is its position in the
list, c the group size; every group runs the distributed program against the same baseline
inputs. ``inputs`` entries (parameter number, or name with or without ``%``):

- ``duplicate``: every rank gets the whole baseline input;
- ``sharded`` (``dim``, optional ``blocks``): rank r gets the r-th of c equal pieces along
  ``dim``; with ``blocks`` the dim is a concatenation of blocks and rank r gets the r-th piece
  of each block, concatenated in block order;
- ``gathered: {dim, groups}`` on a duplicate or sharded entry (FSDP): rank r's piece is cut
  further into ``len(group)`` equal blocks along ``dim``, block j to the j-th device of its
  group in ``groups``;
- ``padded`` (``dim``, ``width``): the baseline input extended with zeros along ``dim`` to
  c·width elements, and rank r gets elements [r·width, (r+1)·width) of that; with ``blocks``
  (``width`` one per block) each block is padded so on its own and rank r gets its piece of
  every block, in block order (a fused QKV weight whose heads do not divide over the ranks);
  with ``head_groups`` K dim is K equal groups, each padded on its own to (c/K)·width and
  split over its c/K ranks (rank r in group floor(r·K/c));
- ``grouped`` (``dim``, ``head_groups`` K): rank r gets block floor(r·K/c) of K equal blocks
  along ``dim`` (KV heads replicated to the group size);
- ``rank`` (distributed only): integer scalar holding the rank's index in its group;
- ``token`` (distributed only): torch-xla's collective token, 0 at program start;
- ``partial`` (``op``: ``add`` (default), ``max`` or ``min``): rank r gets a random piece and
  the baseline input is their sum (max, min). Float pieces of a sum are multiples of 1/8 so the
  sum is exact in f32/f16/bf16 for moderate magnitudes.

``per_group_data: true`` on an input entry: the groups hold different values of it (the data
parallel batch: each group its own part of the global batch, the baseline's input being one
group's part). Each group then gets its own random baseline value (drawn after group 0's, so a
pair without the key gets the inputs it always got), the baseline is executed once per group and
each group is compared with its own baseline run. Without the key every group runs against the
same baseline input, and a program that mixes the groups (a ppermute or a max across the DP
axis) computes the same numbers as one that does not.

``int_range: [lo, hi)`` on an integer input (default ``[0, 8)``). Floats ~ N(0, 1) in the
parameter dtype, pred uniform, complex with N(0, 1) parts.

Edge inputs (a seed >= EDGE_SEEDS_FROM; the witness's default seeds end with one): random
values rarely land where a program's compares, clamps and ids turn on, so a bug in a rare row
(an id at a vocab shard's boundary masked off by one, ``>`` for ``>=`` at a threshold, a tie
between shards broken the other way) stays hidden. On an edge seed every edge value of an
integer input is placed once (as many as fit, block boundaries first) and half of its other
elements are drawn from them: the block boundaries ``k·b - 1, k·b`` of every sharded or padded
input dim (b its extent per rank: where vocab ids change owner), the ends of its range, and
the integer constants the programs hold (and their neighbours), all within the declared range;
floats get ties (a quarter rounded to halves, so equal values fall on several ranks), the
float constants the programs hold (thresholds, clamp bounds, up to 1024, 64 in 16 bits: a sixth
of the elements exactly there) and larger magnitudes (an eighth scaled up 8x, 2x in 16 bits,
where clamps act without overflowing an exp). The baseline values still satisfy every declared
relation and range, so a difference on them is a real one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .runtime import Param, Program

INPUT_RELATIONS = ("duplicate", "sharded", "rank", "partial", "token", "padded", "grouped")
EDGE_SEEDS_FROM = 1000


def is_edge_seed(seed: int) -> bool:
    return seed >= EDGE_SEEDS_FROM


class Edges:
    """The values an edge seed draws from (see the module doc): ``inner`` block boundaries
    (where a row changes owner: drawn first), ``outer`` ends and constants, ``floats``."""

    def __init__(self, inner: list[int], outer: list[int], floats: set[float]) -> None:
        self.inner, self.outer = inner, outer
        self.floats = sorted(floats)

    def int_values(self, lo: int, hi: int) -> list[int]:
        """The edge integers in [lo, hi): boundaries, then the range's ends, then the rest."""
        return [v for v in dict.fromkeys([*self.inner, lo, hi - 1, *self.outer]) if lo <= v < hi]


_INT_CONST = re.compile(r"\b[su](?:8|16|32|64)\[\]\s+constant\((-?\d+)\)")
_FLOAT_CONST = re.compile(r"\b(?:f16|bf16|f32|f64)\[\]\s+constant\((-?[0-9.]+(?:e[-+]?\d+)?)\)")


def edges_of(base: Program, dist: Program, relations: dict[str, Any], c: int) -> Edges:
    """Edge values from the relations' block sizes and the programs' scalar constants."""
    inner: list[int] = []  # k·b - 1, k·b for 0 < k < c: a row at a rank boundary
    outer: list[int] = []  # the dims' ends and the programs' integer constants (and neighbours)
    for k, e in enumerate(relations.get("inputs") or []):
        rel = e.get("relation")
        if rel not in ("sharded", "padded") or e.get("baseline") is None:
            continue
        try:
            shape = base.param(e["baseline"], f"inputs[{k}].baseline").shape
            dim = norm_dim(e.get("dim"), len(shape), f"inputs[{k}]")
        except ValueError:
            continue
        if rel == "padded" and e.get("blocks"):
            bw = e["width"] if isinstance(e.get("width"), list) else [e.get("width")] * len(e["blocks"])
            widths, start = [], 0
            for b, w in zip(e["blocks"], bw, strict=False):
                if isinstance(w, int):
                    widths.append((start, int(w), int(b)))
                start += int(b)
        elif rel == "padded" and isinstance(e.get("width"), int):
            widths = [(0, int(e["width"]), c * int(e["width"]))]
        else:
            blocks = [int(b) for b in e.get("blocks") or []] or [shape[dim]]
            widths, start = [], 0
            for b in blocks:
                widths.append((start, b // c, b))
                start += b
        for start, w, size in widths:
            if w < 1:
                continue
            for j in range(1, c):
                inner.extend([start + j * w - 1, start + j * w])
            outer.extend([start, start + size - 1])
    floats: set[float] = set()
    for text in (base.text, dist.text):
        for m in _INT_CONST.finditer(text):
            v = int(m.group(1))
            outer.extend([v - 1, v, v + 1])
        for m in _FLOAT_CONST.finditer(text):
            v = float(m.group(1))
            if np.isfinite(v) and abs(v) < 1e6:
                floats.add(v)
    return Edges(inner, outer, floats)


def is_float(dt: np.dtype) -> bool:
    if dt.kind == "f":
        return True
    if dt.kind == "V":  # ml_dtypes: bfloat16, float8_*, ...
        import ml_dtypes

        try:
            ml_dtypes.finfo(dt)
        except ValueError:
            return False
        return True
    return False


def random_array(rng: np.random.Generator, p: Param, entry: dict[str, Any], edges: Edges | None = None) -> np.ndarray:
    dt, shape = p.dtype, p.shape
    if is_float(dt):
        x = rng.standard_normal(shape)
        if edges is not None:
            x = _edge_floats(rng, x, edges, dt.itemsize <= 2)
        return x.astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind in "iu":
        lo, hi = entry.get("int_range", [0, 8])
        x = rng.integers(int(lo), int(hi), size=shape)
        if edges is not None and x.size:
            # Every edge value once (as many as fit, boundaries first) at random places, and
            # half of the other elements drawn from them too.
            vals = np.array(edges.int_values(int(lo), int(hi)), dtype=np.int64)
            flat = np.where(rng.random(x.size) < 0.5, rng.choice(vals, size=x.size), x.reshape(-1))
            m = min(len(vals), x.size)
            flat[rng.permutation(x.size)[:m]] = vals[:m]
            x = flat.reshape(shape)
        return x.astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise NotImplementedError(f"cannot generate inputs of dtype {dt}")


def _edge_floats(rng: np.random.Generator, x: np.ndarray, edges: Edges, narrow: bool) -> np.ndarray:
    """Ties, the programs' float constants and larger magnitudes mixed into normals x."""
    x = np.where(rng.random(x.shape) < 0.25, np.round(x * 2) / 2, x)
    # Thresholds and clamp bounds, not the large fillers masks use (-1e4, -65504 in 16 bits):
    # inputs at those would overflow a sum in one order and not in another, a difference of
    # rounding that is no witness of anything.
    limit = 64.0 if narrow else 1024.0
    near = [v for v in edges.floats if abs(v) <= limit]
    if near:
        x = np.where(rng.random(x.shape) < 1 / 6, rng.choice(np.array(near), size=x.shape), x)
    return np.where(rng.random(x.shape) < 0.125, x * (2.0 if narrow else 8.0), x)


def grid_array(rng: np.random.Generator, p: Param) -> np.ndarray:
    """A float input on the 1/8 grid (the baseline of a partial sum: exact piece sums)."""
    v = np.round(rng.standard_normal(p.shape) * 8) / 8
    if p.dtype.kind == "c":
        v = v + 1j * np.round(rng.standard_normal(p.shape) * 8) / 8
    return v.astype(p.dtype)


def norm_dim(dim: Any, ndim: int, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise ValueError(f"{what}: bad dim {dim!r} for rank-{ndim} array")
    return dim % ndim


def split(x: np.ndarray, dim: int, c: int, blocks: Sequence[int] | None, what: str) -> list[np.ndarray]:
    """Rank r's piece for r in 0..c-1 (equal pieces, or per-block pieces)."""
    size = x.shape[dim]
    blocks = [int(b) for b in blocks] if blocks else [size]
    if sum(blocks) != size:
        raise ValueError(f"{what}: blocks {blocks} do not add up to dim {dim} size {size}")
    for b in blocks:
        if b % c:
            raise ValueError(f"{what}: size {b} along dim {dim} is not divisible by {c}")
    pieces: list[list[np.ndarray]] = [[] for _ in range(c)]
    start = 0
    for b in blocks:
        step = b // c
        for r in range(c):
            idx = [slice(None)] * x.ndim
            idx[dim] = slice(start + r * step, start + (r + 1) * step)
            pieces[r].append(x[tuple(idx)])
        start += b
    return [np.concatenate(p, axis=dim) if len(p) > 1 else p[0] for p in pieces]


def padded_pieces(x: np.ndarray, dim: int, c: int, width: Any, what: str, blocks: Any = None) -> list[np.ndarray]:
    """Rank r's piece of x zero-padded along dim to c·width: elements [r·width, (r+1)·width).
    With ``blocks`` (a fused weight) dim is their concatenation, each block padded on its own
    (``width`` one per block, or one for all) and rank r gets its piece of every block, in
    block order."""
    if blocks:
        ws = width if isinstance(width, list) else [width] * len(blocks)
        if sum(blocks) != x.shape[dim] or len(ws) != len(blocks):
            raise ValueError(f"{what}: blocks {blocks!r} with width {width!r} do not tile dim {dim} of size {x.shape[dim]}")
        parts = np.split(x, np.cumsum(blocks)[:-1].tolist(), axis=dim)
        per = [padded_pieces(p, dim, c, w, f"{what} block {i}") for i, (p, w) in enumerate(zip(parts, ws, strict=True))]
        return [np.concatenate([b[r] for b in per], axis=dim) for r in range(c)]
    if not isinstance(width, int) or isinstance(width, bool) or width < 1 or c * width < x.shape[dim]:
        raise ValueError(f"{what}: width {width!r} over {c} ranks does not cover dim {dim} of size {x.shape[dim]}")
    pad = [(0, 0)] * x.ndim
    pad[dim] = (0, c * width - x.shape[dim])
    full = np.pad(x, pad)  # zeros of x's dtype (False for pred)
    return [np.take(full, range(r * width, (r + 1) * width), axis=dim) for r in range(c)]


def group_pieces(x: np.ndarray, dim: int, c: int, k: int, width: Any, what: str) -> list[np.ndarray]:
    """Rank r's piece of x in K = ``k`` head groups along dim (rank r in group floor(r·K/c)):
    its group's whole block (``width`` None: KV heads replicated to the group size), or its
    piece [(r mod c/K)·width, ...) of its group zero-padded at the tail to (c/K)·width."""
    if k < 1 or c % k or x.shape[dim] % k:
        raise ValueError(f"{what}: {k} head groups do not divide c={c} and dim {dim} of size {x.shape[dim]}")
    q = c // k
    groups = np.split(x, k, axis=dim)
    if width is None:
        return [groups[r // q] for r in range(c)]
    per = [padded_pieces(gx, dim, q, width, f"{what} group {g}") for g, gx in enumerate(groups)]
    return [per[r // q][r % q] for r in range(c)]


def partial_pieces(rng: np.random.Generator, base: np.ndarray, c: int, op: str) -> list[np.ndarray]:
    dt = base.dtype
    if dt.kind == "b":
        raise NotImplementedError("partial relation on pred inputs")
    if op in ("max", "min"):
        # One rank (at random per element) holds the value; the others hold less (more).
        sign = 1 if op == "max" else -1
        owner = rng.integers(0, c, size=base.shape)
        pieces = []
        for r in range(c):
            if is_float(dt):
                other = (base.astype(np.float64) - sign * np.abs(rng.standard_normal(base.shape))).astype(dt)
            else:
                step = rng.integers(0, 2, size=base.shape).astype(dt)
                with np.errstate(over="ignore"):
                    other = (base - step) if sign > 0 else (base + step)
                other = np.where(other > base, base, other) if sign > 0 else np.where(other < base, base, other)  # no wrap
            pieces.append(np.where(owner == r, base, other).astype(dt))
        return pieces
    if op != "add":
        raise ValueError(f"unknown partial op {op!r} (add, max, min)")
    if is_float(dt) or dt.kind == "c":
        def grid(shape: tuple[int, ...]) -> np.ndarray:
            v = np.round(rng.standard_normal(shape) * 8) / 8
            if dt.kind == "c":
                v = v + 1j * np.round(rng.standard_normal(shape) * 8) / 8
            return v

        others = [grid(base.shape) for _ in range(c - 1)]
        wide = base.astype(np.complex128 if dt.kind == "c" else np.float64)
        last = wide - sum(others, np.zeros_like(wide))
        return [o.astype(dt) for o in others] + [last.astype(dt)]
    others = [rng.integers(-4, 4, size=base.shape).astype(dt) for _ in range(c - 1)]
    last = base.copy()
    with np.errstate(over="ignore"):
        for o in others:
            last = (last - o).astype(dt)
    return [*others, last]


def groups_of(relations: dict[str, Any]) -> list[list[int]]:
    groups = relations.get("groups")
    if not groups or not all(isinstance(g, list | tuple) and g for g in groups):
        raise ValueError("relations: 'groups' must be a non-empty list of non-empty rank lists")
    groups = [[int(x) for x in g] for g in groups]
    flat = sorted(x for g in groups for x in g)
    if flat != list(range(len(flat))):
        raise ValueError(f"relations: groups {groups} must cover ranks 0..{len(flat) - 1} once")
    return groups


def _gathered_blocks(gathered: Any, what: str) -> dict[int, tuple[Any, int, int]]:
    """device -> (dim, its block's index, blocks) of a ``gathered`` entry ({} without one)."""
    if gathered is None:
        return {}
    if not isinstance(gathered, dict) or not isinstance(gathered.get("groups"), list):
        raise ValueError(f"{what}.gathered: expected {{dim: D, groups: [[device, ...], ...]}}")
    return {int(d): (gathered.get("dim"), j, len(g)) for g in gathered["groups"] for j, d in enumerate(g)}


def make_inputs(base: Program, dist: Program, relations: dict[str, Any], groups: list[list[int]], seed: int) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """(baseline arguments of group 0, distributed arguments per global rank) for one seed."""
    bases, dist_args = make_group_inputs(base, dist, relations, groups, seed)
    return bases[0], dist_args


def per_group_entries(relations: dict[str, Any]) -> list[int]:
    """The input entries whose value differs between the groups (``per_group_data``)."""
    out = []
    for k, e in enumerate(relations.get("inputs") or []):
        v = e.get("per_group_data", False)
        if not isinstance(v, bool):
            raise ValueError(f"inputs[{k}].per_group_data: expected true or false, got {v!r}")
        if v:
            if e.get("relation") in ("rank", "token"):
                raise ValueError(f"inputs[{k}].per_group_data: a {e.get('relation')} input has no baseline value to vary")
            out.append(k)
    return out


def make_group_inputs(base: Program, dist: Program, relations: dict[str, Any], groups: list[list[int]], seed: int) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """(baseline arguments per group, distributed arguments per global rank) for one seed. The
    groups' lists are one and the same object when no entry is ``per_group_data``."""
    rng = np.random.default_rng(seed)
    edges = edges_of(base, dist, relations, len(groups[0])) if is_edge_seed(seed) else None
    n = sum(len(g) for g in groups)
    entries = list(relations.get("inputs") or [])
    base_of: dict[int, int] = {}
    for k, e in enumerate(entries):
        rel = e.get("relation")
        if rel not in INPUT_RELATIONS:
            raise ValueError(f"inputs[{k}]: unknown relation {rel!r}")
        if rel not in ("rank", "token"):
            if e.get("baseline") is None:
                raise ValueError(f"inputs[{k}]: relation {rel} needs a baseline parameter")
            bp = base.param(e["baseline"], f"inputs[{k}].baseline")
            if bp.number in base_of.values():
                raise ValueError(f"inputs[{k}]: baseline parameter {bp.number} listed twice")
            base_of[k] = bp.number
    base_args: list[np.ndarray | None] = [None] * len(base.params)
    for k, e in enumerate(entries):
        if k in base_of:
            bp = base.params[base_of[k]]
            fl = is_float(bp.dtype) or bp.dtype.kind == "c"
            grid = e.get("relation") == "partial" and e.get("op", "add") == "add" and fl
            base_args[bp.number] = grid_array(rng, bp) if grid else random_array(rng, bp, e, edges)
    missing = sorted(set(range(len(base.params))) - set(base_of.values()))
    if missing:
        raise ValueError(f"relations: baseline parameters {missing} have no input entry")
    group_base = [base_args] * len(groups)
    varying = [k for k in per_group_entries(relations) if k in base_of]
    if varying and len(groups) > 1:
        group_base = [base_args] + [list(base_args) for _ in groups[1:]]
        for own in group_base[1:]:
            for k in varying:
                e, bp = entries[k], base.params[base_of[k]]
                fl = is_float(bp.dtype) or bp.dtype.kind == "c"
                grid = e.get("relation") == "partial" and e.get("op", "add") == "add" and fl
                own[bp.number] = grid_array(rng, bp) if grid else random_array(rng, bp, e, edges)
    dist_args: list[list[np.ndarray | None]] = [[None] * len(dist.params) for _ in range(n)]
    seen: set[int] = set()
    for k, e in enumerate(entries):
        if e.get("distributed") is None:
            raise ValueError(f"inputs[{k}]: no distributed parameter")
        dp = dist.param(e["distributed"], f"inputs[{k}].distributed")
        if dp.number in seen:
            raise ValueError(f"inputs[{k}]: distributed parameter {dp.number} listed twice")
        seen.add(dp.number)
        rel = e["relation"]
        gathered = _gathered_blocks(e.get("gathered"), f"inputs[{k}]")
        for gi, g in enumerate(groups):
            c = len(g)
            if rel == "rank":
                if dp.shape != () or dp.dtype.kind not in "iu":
                    raise ValueError(f"inputs[{k}]: rank parameter must be an integer scalar, got {dp.dtype}{list(dp.shape)}")
                pieces = [np.array(r, dtype=dp.dtype) for r in range(c)]
            elif rel == "token":
                pieces = [np.zeros(dp.shape, dtype=dp.dtype)] * c
            else:
                x = group_base[gi][base_of[k]]
                assert x is not None
                if rel == "duplicate":
                    pieces = [x] * c
                elif rel == "sharded":
                    pieces = split(x, norm_dim(e.get("dim"), x.ndim, f"inputs[{k}]"), c, e.get("blocks"), f"inputs[{k}]")
                elif rel == "grouped" or (rel == "padded" and int(e.get("head_groups", 1)) > 1):
                    pieces = group_pieces(x, norm_dim(e.get("dim"), x.ndim, f"inputs[{k}]"), c, int(e.get("head_groups", 1)), e.get("width") if rel == "padded" else None, f"inputs[{k}]")
                elif rel == "padded":
                    pieces = padded_pieces(x, norm_dim(e.get("dim"), x.ndim, f"inputs[{k}]"), c, e.get("width"), f"inputs[{k}]", e.get("blocks"))
                else:
                    pieces = partial_pieces(rng, x, c, str(e.get("op", "add")))
            for r, gid in enumerate(g):
                piece = pieces[r]
                if gathered:
                    gd, j, m = gathered[gid]
                    piece = split(piece, norm_dim(gd, piece.ndim, f"inputs[{k}].gathered"), m, None, f"inputs[{k}].gathered")[j]
                if piece.dtype != dp.dtype or piece.shape != dp.shape:
                    raise ValueError(f"inputs[{k}] ({rel}): rank {r} would get {piece.dtype}{list(piece.shape)} but distributed parameter {dp.number} ({dp.name}) is {dp.dtype}{list(dp.shape)}")
                dist_args[gid][dp.number] = piece
    missing = [p.number for p in dist.params if dist_args[0][p.number] is None]
    if missing:
        raise ValueError(f"relations: distributed parameters {missing} have no input entry")
    compact = {id(b): [a for a in b if a is not None] for b in group_base}
    return [compact[id(b)] for b in group_base], [[a for a in rank if a is not None] for rank in dist_args]


def fill_elided(text: str, names: Sequence[str], seed: int = 0) -> str:
    """``text`` with each elided entry constant named in ``names`` (``constant({...})``, see
    relations.ASSUMPTIONS "elided-constants") written out with values drawn from ``seed`` and
    the constant's name and shape only, so the baseline's and the distributed program's
    namesakes get the same values and a divergence under the assumption can still be
    executed. Floats ~ N(0, 1) in the constant's type, integers in [0, 8), pred uniform."""
    import re
    import zlib

    from ..hlo.literals import round_to

    for name in names:
        # The whole name: not the tail of another (``%a`` must not match ``%ba``).
        pat = re.compile(r"(?<![\w.\-])(%?" + re.escape(name) + r"\s*=\s*([a-z0-9]+)\[([0-9,\s]*)\](?:\{[^}]*\})?\s+constant\()\{\.\.\.\}(\))")
        m = pat.search(text)
        if m is None:
            continue
        dtype, dims = m.group(2), tuple(int(d) for d in m.group(3).replace(" ", "").split(",") if d)
        rng = np.random.default_rng([seed, zlib.crc32(f"{name}|{dtype}|{dims}".encode())])
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if dtype == "pred":
            flat = ["true" if v else "false" for v in rng.integers(0, 2, size=n)]
        elif dtype[0] in "su" and dtype[1:].isdigit():
            flat = [str(int(v)) for v in rng.integers(0, 8, size=n)]
        elif dtype in ("f16", "bf16", "f32", "f64"):
            flat = [repr(round_to(dtype, float(v))) for v in rng.standard_normal(n)]
        else:  # a type this fill does not write: left elided (the witness then refuses the text)
            continue

        def nest(values: list[str], shape: tuple[int, ...]) -> str:
            if len(shape) <= 1:
                return "{" + ", ".join(values) + "}"
            step = len(values) // shape[0]
            return "{" + ", ".join(nest(values[k * step:(k + 1) * step], shape[1:]) for k in range(shape[0])) + "}"

        literal = nest(flat, dims) if dims else flat[0]
        text = text[: m.start()] + m.group(1) + literal + m.group(4) + text[m.end():]
    return text
