"""Cut both graphs at layer boundaries into segment pairs that are proven one after another.

A segment holds the instructions of one layer (by the module path in ``op_name``: the front end's
``layers.17`` scopes, JAX's ``layers_17``, or a user pattern). Each segment pair becomes its own
small e-graph: instructions of earlier segments that it reads become parameters seeded with the
facts already proven about them. Cutting loses only completeness (an equality that needs both
sides of a cut is not found), never soundness: every seeded fact was proven.

Identical layers are proven once. The memo key is the segment pair's whole canonical text
(signatures, operand wiring by position, seeded facts), compared in full — a hash is only shown
for reports — so two segments share a result only when they are the same problem.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import Computation, Instruction, Module
from .ops import LEAVES

DEFAULT_LAYER_PATTERN = r"(?:^|[/._])(?:layers|layer|blocks|block|h)[._/](\d+)(?=$|[/._])"

# The backward pass runs the layers in reverse: the backward of layer k gets the label
# BACKWARD_BASE - k, after every forward label and after the backward of layer k + 1. The front
# end names each autograd instruction ``backward.N/<module path>/...`` (the module whose forward
# it differentiates); JAX names transposed instructions ``transpose(...)``.
BACKWARD_BASE = 1 << 30
_BACKWARD_RE = re.compile(r"(?:^|/)(?:backward(?:\.\d+)?(?:/|$)|transpose\()")


def layer_label(op_name: str, rx: re.Pattern[str]) -> int:
    """The layer an instruction names in its op_name (-1: none, it inherits its operands')."""
    m = rx.search(op_name)
    if m is None:
        return -1
    n = int(m.group(1))
    return BACKWARD_BASE - n if _BACKWARD_RE.search(op_name) else n


def is_backward(label: int) -> bool:
    return label > BACKWARD_BASE // 2


def label_text(label: int) -> str:
    """A segment label for people: ``7`` or ``backward of 7``."""
    return f"backward of {BACKWARD_BASE - label}" if is_backward(label) else str(label)

OpName = Callable[[Instruction], str]


@dataclass
class Segment:
    label: int  # layer number; -1 for the prologue (embedding, before any layer)
    baseline: list[str] = field(default_factory=list)
    distributed: list[str] = field(default_factory=list)


def _const_cone(comp: Computation) -> set[str]:
    """Instructions computed from literals only: copied into every segment that uses them."""
    cone: set[str] = set()
    for ins in comp.instructions:
        if ins.opcode in ("constant", "iota") or (ins.operands and ins.opcode != "parameter" and all(o in cone for o in ins.operands)):
            cone.add(ins.name)
    return cone


def _layers(comp: Computation, op_name: OpName, pattern: re.Pattern[str], fixed: dict[str, int] | None = None) -> dict[str, int]:
    cone = _const_cone(comp)
    layer: dict[str, int] = {}
    for ins in comp.instructions:
        if fixed and ins.name in fixed:
            layer[ins.name] = fixed[ins.name]  # a folded layer's placeholder keeps its block's layer
            continue
        if ins.opcode in LEAVES or ins.name in cone:
            continue
        inherited = max((layer[o] for o in ins.operands if o in layer), default=-1)
        explicit = layer_label(op_name(ins) or "", pattern)
        # Never earlier than an operand: segments must stay in topological order.
        layer[ins.name] = max(explicit, inherited)
    return layer


def plan(base: Module, dist: Module, base_op_name: OpName, dist_op_name: OpName, pattern: str | None = None, fixed: dict[str, dict[str, int]] | None = None) -> list[Segment] | None:
    """Segment pairs in order, or None when the graphs do not cut the same way. ``fixed``:
    per side, instructions whose layer is already known (placeholders of folded layers)."""
    rx = re.compile(pattern or DEFAULT_LAYER_PATTERN)
    lb = _layers(base.entry, base_op_name, rx, (fixed or {}).get("baseline"))
    ld = _layers(dist.entry, dist_op_name, rx, (fixed or {}).get("distributed"))
    labels = sorted(set(lb.values()))
    if labels != sorted(set(ld.values())) or len(labels) < 2:
        return None
    segs = {k: Segment(k) for k in labels}
    for ins in base.entry.instructions:
        if ins.name in lb:
            segs[lb[ins.name]].baseline.append(ins.name)
    for ins in dist.entry.instructions:
        if ins.name in ld:
            segs[ld[ins.name]].distributed.append(ins.name)
    return [segs[k] for k in labels]


@dataclass
class View:
    """What one side of a segment holds, in the module's instruction order: its own
    instructions, the leaves and literal cones they read (copied in), and the instructions of
    earlier segments they read (``boundary``: parameters in the segment's e-graph)."""

    names: list[str]
    boundary: set[str]


class Side:
    """One graph prepared once for cutting many segments out of it."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.comp = module.entry
        self.order = {ins.name: i for i, ins in enumerate(self.comp.instructions)}
        self.cone = _const_cone(self.comp)

    def view(self, names: list[str]) -> View:
        comp = self.comp
        own = set(names)
        needed: set[str] = set()
        boundary: set[str] = set()
        for n in names:
            for o in comp[n].operands:
                if o in own or o in needed:
                    continue
                needed.add(o)
                ins = comp[o]
                if ins.opcode in LEAVES or o in self.cone:
                    stack = list(ins.operands)
                    while stack:
                        x = stack.pop()
                        if x not in needed:
                            needed.add(x)
                            stack.extend(comp[x].operands)
                else:
                    boundary.add(o)
        return View(sorted(own | needed, key=self.order.__getitem__), boundary)

    def sub_module(self, view: View, tag: str) -> Module:
        comp = self.comp
        out: list[Instruction] = []
        for name in view.names:
            ins = comp[name]
            if name in view.boundary:
                ins = Instruction(name, "parameter", ins.shape, [], metadata=ins.metadata, loc=ins.loc)
            out.append(ins)
        return Module(f"{self.module.name}.{tag}", {comp.name: Computation(comp.name, out, True, comp.loc)}, comp.name, self.module.header, self.module.path)


def stages(segments: list[Segment], base: Side, dist: Side) -> list[list[int]]:
    """Segments grouped into topological levels: a segment's level is one more than that of any
    segment it reads from; segments of one level are independent and may run in parallel."""
    owner: dict[tuple[str, str], int] = {}
    for i, seg in enumerate(segments):
        owner.update({("b", n): i for n in seg.baseline})
        owner.update({("d", n): i for n in seg.distributed})
    level: list[int] = []
    for i, seg in enumerate(segments):
        deps = {owner[("b", o)] for n in seg.baseline for o in base.comp[n].operands if ("b", o) in owner}
        deps |= {owner[("d", o)] for n in seg.distributed for o in dist.comp[n].operands if ("d", o) in owner}
        deps.discard(i)
        level.append(1 + max((level[d] for d in deps), default=-1))
    out: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for i, lv in enumerate(level):
        out[lv].append(i)
    return out


def fingerprint(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]
