"""The picture in trace.html: the neighbourhood of a divergence in both graphs, side by side.

Presentation only: it reads the HLO text the verifier already checked and places the few
instructions around the frontier (its operands a few levels up, its users one level down) in
layers, so a person sees which operand arrived with which relation. Nothing here decides a
relation; colours come from the relations the result document states.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_H = 52
LINE_H = 14  # each extra line of a node: its module and file:line, its code
LABEL_CHARS = 40  # a code label longer than this is cut (the tooltip has it whole)
LAYER_GAP = 34
H_GAP = 18
CHAR_W = 6.6  # 11px monospace
PAD = 14

_NAME = re.compile(r"%([\w.\-]+)")


@dataclass
class GNode:
    name: str
    opcode: str
    shape: str
    role: str  # frontier | counterpart | partial | related | unrelated | context
    relation: str = ""  # short text under the node
    tooltip: str = ""
    where: str = ""  # module path and file:line, from the source map
    code: str = ""  # the code on that line
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = NODE_H

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass
class GEdge:
    src: str
    dst: str
    d: str = ""  # SVG path


@dataclass
class Panel:
    """One side's picture. Its words (titles, labels, why it is missing) live in trace.html.j2."""

    side: str  # baseline | distributed
    focus: str = ""  # the instruction the picture centres on
    kind: str = ""  # frontier | counterpart | operands
    nodes: list[GNode] = field(default_factory=list)
    edges: list[GEdge] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0
    missing: str = ""  # no_artifact | unreadable | not_found | no_counterpart (no picture)
    detail: str = ""


def _entry(module: Any) -> Any:
    return module.computations[module.entry_name]


def _select(comp: Any, focus: list[str], up: int, down: int, cap: int) -> list[str]:
    """Focus instructions, their operands up to ``up`` levels, their users ``down`` levels."""
    users: dict[str, list[str]] = {}
    for ins in comp.instructions:
        for op in ins.operands:
            users.setdefault(op, []).append(ins.name)
    chosen: list[str] = [f for f in focus if comp.get(f) is not None]
    seen = set(chosen)
    frontier = list(chosen)
    for _ in range(up):
        nxt = []
        for n in frontier:
            for op in comp[n].operands:
                if op not in seen and len(seen) < cap:
                    seen.add(op)
                    chosen.append(op)
                    nxt.append(op)
        frontier = nxt
    frontier = [f for f in focus if f in seen]
    for _ in range(down):
        nxt = []
        for n in frontier:
            for u in users.get(n, [])[:3]:
                if u not in seen and len(seen) < cap + 3:
                    seen.add(u)
                    chosen.append(u)
                    nxt.append(u)
        frontier = nxt
    order = {ins.name: k for k, ins in enumerate(comp.instructions)}
    return sorted(chosen, key=lambda n: order.get(n, 0))


def _layout(panel: Panel, comp: Any, names: list[str]) -> None:
    chosen = set(names)
    depth: dict[str, int] = {}
    for n in names:  # printed order is topological
        ops = [o for o in comp[n].operands if o in chosen]
        depth[n] = 1 + max((depth[o] for o in ops), default=-1)
    layers: dict[int, list[GNode]] = {}
    by_name = {g.name: g for g in panel.nodes}
    for n in names:
        layers.setdefault(depth[n], []).append(by_name[n])
    for g in panel.nodes:
        # The third line's words come from the template: leave room for the longest of them.
        tag = {"frontier": 21, "counterpart": 12}.get(g.role, len(g.relation) + 2)
        label = max(len(g.name) + 1, len(f"{g.opcode} {g.shape}"), tag, len(g.where), len(g.code))
        g.w = max(96.0, label * CHAR_W + 2 * 10)
        g.h = NODE_H + LINE_H * (bool(g.where) + bool(g.code))
    y = PAD + 4.0
    for d in sorted(layers):
        row = layers[d]
        if d > 0:
            # Barycentre ordering keeps edges short and mostly uncrossed.
            def bary(g: GNode, d: int = d) -> float:
                xs = [by_name[o].cx for o in comp[g.name].operands if o in by_name and depth[o] < d]
                return sum(xs) / len(xs) if xs else 0.0

            row.sort(key=bary)
        x = PAD
        for g in row:
            g.x, g.y = x, y
            x += g.w + H_GAP
        panel.width = max(panel.width, x - H_GAP + PAD)
        y += max(g.h for g in row) + LAYER_GAP
    panel.height = y - LAYER_GAP + PAD
    # Centre each row under the widest one.
    for row in layers.values():
        span = row[-1].x + row[-1].w - row[0].x
        shift = (panel.width - 2 * PAD - span) / 2
        for g in row:
            g.x += shift
    for n in names:
        for o in comp[n].operands:
            if o in by_name:
                a, b = by_name[o], by_name[n]
                x1, y1, x2, y2 = a.cx, a.y + a.h, b.cx, b.y
                mid = (y1 + y2) / 2
                panel.edges.append(GEdge(o, n, f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2 - 3:.1f}"))


def _short(rel: str, n: int = 30) -> str:
    return rel if len(rel) <= n else rel[: n - 1] + "…"


Labeler = Any  # Callable[[str], tuple[str, str]]: instruction name -> (where, code)


def _label(g: GNode, label: Labeler | None) -> GNode:
    if label is not None:
        where, text = label(g.name)
        g.where = where
        g.code = text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"
        if where or text:
            g.tooltip += f"\n{where}: {text}" if text else f"\n{where}"
    return g


def distributed_panel(module: Any, divergence: dict[str, Any], steps: list[dict[str, Any]], label: Labeler | None = None) -> Panel:
    comp = _entry(module)
    name = str(divergence.get("instruction", "")).lstrip("%")
    panel = Panel("distributed", name, "frontier")
    if comp.get(name) is None:
        panel.missing, panel.detail = "not_found", name
        return panel
    known: dict[str, str] = {}
    for s in steps:
        d = str(s.get("distributed", "")).lstrip("%")
        known.setdefault(d, f"{s.get('relation')} of {s.get('baseline')}")
    for op in divergence.get("operands") or []:
        known[str(op.get("instruction", "")).lstrip("%")] = str(op.get("relation", ""))
    names = _select(comp, [name], up=3, down=1, cap=14)
    ancestors = set(names[: names.index(name)]) if name in names else set()
    for n in names:
        ins = comp[n]
        rel = known.get(n, "")
        if n == name:
            role, short = "frontier", ""
        elif rel:
            role = "partial" if rel.startswith("partial") else "related"
            short = _short(rel.split(" of ")[0])
        else:
            role, short = ("unrelated" if n not in ancestors else "context"), ""
        panel.nodes.append(_label(GNode(n, ins.opcode, str(ins.shape), role, short, f"%{n} = {ins.shape} {ins.opcode}" + (f"\n{rel}" if rel else "")), label))
    _layout(panel, comp, names)
    return panel


def baseline_panel(module: Any, divergence: dict[str, Any], label: Labeler | None = None) -> Panel:
    comp = _entry(module)
    counterpart = _NAME.search(str(divergence.get("baseline_counterpart") or ""))
    matched: dict[str, str] = {}
    for op in divergence.get("operands") or []:
        rel = str(op.get("relation", ""))
        for part in rel.split("; "):
            m = _NAME.search(part.split(" of ", 1)[1]) if " of " in part else None
            if m:
                matched.setdefault(m.group(1), f"{part.split(' of ')[0]} of {op.get('instruction')}")
    focus = [counterpart.group(1)] if counterpart else [m for m in matched if comp.get(m) is not None]
    panel = Panel("baseline", focus[0] if focus else "", "counterpart" if counterpart else "operands")
    if not focus or all(comp.get(f) is None for f in focus):
        panel.missing, panel.detail = ("not_found", focus[0]) if counterpart else ("no_counterpart", "")
        return panel
    names = _select(comp, focus, up=2 if counterpart else 0, down=0 if counterpart else 1, cap=12)
    for n in names:
        ins = comp[n]
        if counterpart and n == counterpart.group(1):
            role, short = "counterpart", ""
        elif n in matched:
            role, short = "related", _short(matched[n].split(" of ")[0])
        else:
            role, short = "context", ""
        panel.nodes.append(_label(GNode(n, ins.opcode, str(ins.shape), role, short, f"%{n} = {ins.shape} {ins.opcode}"), label))
    _layout(panel, comp, names)
    return panel


@functools.lru_cache(maxsize=16)
def _parse(path: Path) -> tuple[Any, str]:
    """Each artifact is parsed once per process, however many divergences it holds."""
    from shardproof.engine.errors import InputError
    from shardproof.engine.hlo.parser import parse_hlo_file

    try:
        return parse_hlo_file(path), ""
    except InputError as e:
        return None, str(e)


def panels(baseline_hlo: Path | None, distributed_hlo: Path | None, divergence: dict[str, Any], steps: list[dict[str, Any]], labels: dict[str, Labeler] | None = None) -> tuple[Panel, Panel]:
    """Both pictures for one divergence; a side without its HLO artifact says so instead.
    ``labels[side]`` names an instruction's module, file:line and code (from the source maps)."""
    labels = labels or {}

    def load(path: Path | None, side: str) -> tuple[Any, Panel]:
        if path is None:
            return None, Panel(side, missing="no_artifact")
        module, err = _parse(path)
        return module, Panel(side, missing="unreadable", detail=err)

    bmod, bmissing = load(baseline_hlo, "baseline")
    dmod, dmissing = load(distributed_hlo, "distributed")
    b = baseline_panel(bmod, divergence, labels.get("baseline")) if bmod else bmissing
    d = distributed_panel(dmod, divergence, steps, labels.get("distributed")) if dmod else dmissing
    return b, d
