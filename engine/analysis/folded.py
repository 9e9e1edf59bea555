"""Relate a folded layer (hlo.fold) by proving its own block, or by reusing the proof of an
earlier block of the same class under the same input facts.

The proof is about the block as written: its lines are cut out of the original text, what it
reads from outside becomes parameters seeded with the facts proven about those values, and
the block is normalized, built and saturated on its own. Its outputs' facts are written in
canonical positions (output j, outside value j), so a later block of the same class — the same
text up to names — with the same canonical seeds takes them over unchanged: it is the same
problem. Facts that name block-internal baseline values are dropped (nothing outside can use
them); that only loses completeness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..hlo.fold import Fold, FoldedLayer
from ..hlo.normalize import normalize
from ..hlo.parser import parse_hlo
from ..hlo.shapecheck import check_module
from ..ir import Instruction
from ..relations import Binding, RelationSpec
from .egg import RunStats
from .facts import Fact, Facts, carried_seeds
from .graph import Graphs, build
from .inputs import outputs, range_seeds
from .laws.layout import LayoutSolver

# (output j, relation, rule, seed template, baseline target: ("out"|"ext", index) or None)
Entry = tuple[int, str, str, str | None, tuple[str, int] | None]
_HANDLE = re.compile(r"@([BD])(\d+)@")


class FoldMismatch(Exception):
    """The parsed, normalized pair does not cut where the text fold cut: verify without folding."""


@dataclass
class BlockResult:
    entries: list[Entry]
    stats: RunStats
    bijections: list[dict[str, Any]]


def seeds(fl: FoldedLayer, g: Graphs, bound: list[tuple[Binding, Instruction | None, Instruction]], known: Facts, binding_seeds: Any, rank_params: set[str], tokens: frozenset[str]) -> list[str]:
    """The facts the block's outside values carry, with handles @Bj@ / @Dj@ for outside value j
    of each side: the same list for two blocks means the same problem. It also says which
    outside values are the rank or a token: the proof reads those by name (graph rows, the
    normalizer), so two blocks that differ there are different problems."""
    b_pos: dict[int, int] = {}
    d_pos: dict[int, int] = {}
    for pos, side in ((b_pos, "baseline"), (d_pos, "distributed")):
        for j, name in enumerate(fl.side(side).ext):
            gid = g.by_name.get((side, name))
            if gid is None:
                raise FoldMismatch(f"layer {fl.label}: %{name} is gone after normalization")
            pos[gid] = j
    out: list[str] = []
    b_names = {name: j for j, name in enumerate(fl.baseline.ext)}
    d_names = {name: j for j, name in enumerate(fl.distributed.ext)}
    out.extend(f";rank-parameter @D{j}@" for name, j in d_names.items() if name in rank_params)
    out.extend(f";token-parameter @D{j}@" for name, j in d_names.items() if name in tokens)
    for b, bp, dp in bound:
        if dp.name not in d_names:
            continue
        if bp is None or bp.name not in b_names:
            # Only the distributed side is read here: its integer range still holds.
            out.extend(range_seeds(b, None, f"@D{d_names[dp.name]}@"))
            continue
        out.extend(binding_seeds(b, f"@B{b_names[bp.name]}@", f"@D{d_names[dp.name]}@", tuple(dp.shape.dims)))
    for dg, j in d_pos.items():
        out.extend(carried_seeds(known, dg, f"@D{j}@", lambda m: f"@B{b_pos[m]}@" if m in b_pos else None))
    return sorted(set(out))


def prove(spec: RelationSpec, fold: Fold, fl: FoldedLayer, canonical_seeds: list[str], rank_params: set[str], tokens: frozenset[str], solver: LayoutSolver, budget: Any, solve: Any) -> BlockResult:
    """Prove the block of layer fl.label on its own under the canonical seeds."""
    base = parse_hlo(fold.block_text("baseline", fl), fold.paths["baseline"])
    dist = parse_hlo(fold.block_text("distributed", fl), fold.paths["distributed"])
    check_module(base)
    check_module(dist)
    base, dist = normalize(base), normalize(dist, tokens)
    sg = build(spec, base, dist, rank_params)
    if sg.unsupported:
        return BlockResult([], RunStats(0, True, 0.0), [])
    handles: dict[str, int] = {}
    for tag, side in (("B", "baseline"), ("D", "distributed")):
        for j, name in enumerate(fl.side(side).ext):
            gid = sg.by_name.get((side, name))
            if gid is not None:
                handles[f"{tag}{j}"] = gid
    local_seeds = []
    for s in canonical_seeds:
        if s.startswith(";"):
            continue  # a key part (rank / token names), not an egglog fact
        hs = _HANDLE.findall(s)
        if all(t + j in handles for t, j in hs):
            local_seeds.append(_HANDLE.sub(lambda m: str(handles[m.group(1) + m.group(2)]), s))
    facts, stats = solve(sg, local_seeds, solver, budget)
    b_outs = [sg.by_name[("baseline", i.name)] for i in outputs(base)]
    d_outs = [sg.by_name[("distributed", i.name)] for i in outputs(dist)]
    if len(b_outs) != len(fl.baseline.outputs) or len(d_outs) != len(fl.distributed.outputs):
        return BlockResult([], stats, [])
    target: dict[int, tuple[str, int]] = {}
    for j, name in enumerate(fl.baseline.ext):
        if (lg := sg.by_name.get(("baseline", name))) is not None:
            target.setdefault(lg, ("ext", j))
    for j, gid in enumerate(b_outs):
        target[gid] = ("out", j)
    entries: list[Entry] = []
    for j, dg in enumerate(d_outs):
        for f in facts.by_dist.get(dg, []):
            if f.baseline < 0:
                entries.append((j, f.relation, f.rule, f.seed, None))
                continue
            for m in facts.members.get(f.baseline, []):
                if m in target:
                    entries.append((j, f.relation, f.rule, f.seed, target[m]))
    bijections = [{k: v for k, v in b.items() if k != "gids"} | {"layer": fl.label} for b in facts.bijections]
    return BlockResult(entries, stats, bijections)


def merge(known: Facts, seen: set[tuple[int, str, frozenset[int]]], result: BlockResult, fl: FoldedLayer, g: Graphs, proven_as: int) -> None:
    """Give the placeholders of layer fl.label the facts of its block's proof."""
    d_out = [g.by_name[("distributed", n)] for n in fl.distributed.outputs]
    targets = {
        "out": [g.by_name[("baseline", n)] for n in fl.baseline.outputs],
        "ext": [g.by_name[("baseline", n)] for n in fl.baseline.ext],
    }
    cls_of: dict[int, int] = {}
    how = f"layer {fl.label} proven whole" if proven_as == fl.label else f"layer {fl.label} is layer {proven_as} up to names (same input facts)"
    for j, relation, rule, seed, tgt in result.entries:
        dg = d_out[j]
        if tgt is None:
            key = (dg, relation, frozenset())
            if key not in seen:
                seen.add(key)
                known.by_dist.setdefault(dg, []).append(Fact(-1, dg, relation, f"{rule}; {how}", seed))
            continue
        bg = targets[tgt[0]][tgt[1]]
        if bg not in cls_of:
            cls_of[bg] = len(known.members)
            known.members[cls_of[bg]] = [bg]
            known.classes.setdefault(bg, cls_of[bg])
        key = (dg, relation, frozenset([bg]))
        if key in seen:
            continue
        seen.add(key)
        known.by_dist.setdefault(dg, []).append(Fact(cls_of[bg], dg, relation, f"{rule}; {how}", seed))
    if proven_as == fl.label:
        for b in result.bijections:
            if b not in known.bijections:
                known.bijections.append(b)
