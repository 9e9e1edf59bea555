"""Tables of rules/vocabraw.egg (vocab-parallel embedding comparing raw ids with the bounds).

``maskunflat(kbc, kr, kp, kf)``  a per-id mask over gathered rows of flattened ids laid out
                                 again (below).

Side conditions: shapes only; the compares' laws (rules/vocabraw.egg) hold for every int type.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph import Graphs

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("maskunflat",)


def graph_rows(rows: Rows, g: Graphs) -> None:
    """maskunflat(kbc, kr, kp, kf) (rules/vocabraw.egg): ids of shape S were flattened to [N]
    by the row-major reshape kf before the row gather kp ([N] ids -> [N, h] rows); reshape kr
    lays the rows out as [*S, h] again, and broadcast kbc spreads a per-id mask of shape S over
    those rows (its dims are S's, in order, h the new one). Then element (p, j) of every
    tensor involved belongs to the id at position p of S."""
    nodes = [n for n in g.nodes if n.side == "distributed" and n.sig is not None]
    gathers = {n.sig.key(): n for n in nodes if n.ins.opcode == "gather"}  # type: ignore[union-attr]
    reshapes = [n for n in nodes if n.ins.opcode == "reshape"]
    flattens = {n.sig.key(): (g.nodes[n.operands[0]].ins.shape.dims, n.ins.shape.dims) for n in g.nodes if n.sig is not None and n.ins.opcode == "reshape" and n.ins.shape.rank == 1}  # type: ignore[union-attr]
    bcasts = [n for n in nodes if n.ins.opcode == "broadcast" and g.nodes[n.operands[0]].ins.shape.dtype == "pred"]
    for _, kp, _w in rows["gathershard"]:
        gather = gathers.get(str(kp))
        if gather is None or gather.ins.shape.rank != 2 or list(gather.ins.parsed.get("offset_dims", [])) != [1]:
            continue
        n_ids, h = gather.ins.shape.dims
        for r in reshapes:
            if g.nodes[r.operands[0]].ins.shape.dims != (n_ids, h):
                continue
            out = r.ins.shape.dims
            if len(out) < 2 or out[-1] != h or math.prod(out[:-1]) != n_ids:
                continue
            shape = out[:-1]
            for kf, (src, dst) in flattens.items():
                if src != shape or dst != (n_ids,):
                    continue
                for b in bcasts:
                    if b.ins.shape.dims == out and g.nodes[b.operands[0]].ins.shape.dims == shape and list(b.ins.parsed.get("dimensions", [])) == list(range(len(shape))):
                        rows["maskunflat"].append((b.sig.key(), r.sig.key(), kp, kf))  # type: ignore[union-attr]

