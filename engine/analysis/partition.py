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


def _layers(comp: Computation, op_name: OpName, pattern: re.Pattern[str]) -> dict[str, int]:
    cone = _const_cone(comp)
    layer: dict[str, int] = {}
    for ins in comp.instructions:
        if ins.opcode in LEAVES or ins.name in cone:
            continue
        inherited = max((layer[o] for o in ins.operands if o in layer), default=-1)
        m = pattern.search(op_name(ins) or "")
        explicit = int(m.group(1)) if m else -1
        # Never earlier than an operand: segments must stay in topological order.
        layer[ins.name] = max(explicit, inherited)
    return layer


def plan(base: Module, dist: Module, base_op_name: OpName, dist_op_name: OpName, pattern: str | None = None) -> list[Segment] | None:
    """Segment pairs in order, or None when the graphs do not cut the same way."""
    rx = re.compile(pattern or DEFAULT_LAYER_PATTERN)
    lb = _layers(base.entry, base_op_name, rx)
    ld = _layers(dist.entry, dist_op_name, rx)
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


def sub_module(module: Module, names: list[str], side_tag: str) -> tuple[Module, list[str]]:
    """The segment's instructions with what they read: leaves and literal cones copied in,
    earlier instructions turned into parameters. Returns the module and its boundary inputs."""
    comp = module.entry
    cone = _const_cone(comp)
    own = set(names)
    needed: set[str] = set()
    boundary: list[str] = []
    for n in names:
        for o in comp[n].operands:
            if o in own or o in needed:
                continue
            ins = comp[o]
            if ins.opcode in LEAVES or o in cone:
                needed.add(o)
                stack = list(ins.operands)
                while stack:
                    x = stack.pop()
                    if x not in needed:
                        needed.add(x)
                        stack.extend(comp[x].operands)
            else:
                needed.add(o)
                boundary.append(o)
    out: list[Instruction] = []
    for ins in comp.instructions:
        if ins.name in own or (ins.name in needed and ins.name not in boundary):
            out.append(ins)
        elif ins.name in boundary:
            out.append(Instruction(ins.name, "parameter", ins.shape, [], metadata=ins.metadata, loc=ins.loc))
    sub = Module(f"{module.name}.{side_tag}", {comp.name: Computation(comp.name, out, True, comp.loc)}, comp.name, module.header, module.path)
    return sub, boundary


def canonical(instrs: list[tuple[str, str, list[str]]], seeds: list[str]) -> str:
    """Text of a segment pair that ignores names: (name, signature, operands) per instruction in
    order, operands by position, seeds already written with positional handles."""
    pos: dict[str, int] = {}
    lines = []
    for name, sig, operands in instrs:
        pos[name] = len(pos)
        lines.append(f"{sig}({','.join(str(pos[o]) for o in operands)})")
    return "\n".join(lines) + "\n--\n" + "\n".join(sorted(seeds))


def fingerprint(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]
