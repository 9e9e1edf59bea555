"""Turn the two normalized entry computations into e-graph rows and shape tables.

Node ids are global: baseline instructions first, then distributed ones, so one e-graph holds
both graphs and every fact can name either side.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..ir import Computation, Instruction, Module, Shape
from ..relations import RelationSpec
from .ops import BINARY_POINTWISE, COLLECTIVES, COMMUTATIVE, KNOWN, TERNARY_POINTWISE, UNARY_POINTWISE

POINTWISE = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE
from .signature import Sig, make_sig
from .tables import Tables

MIRROR = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}


@dataclass
class Node:
    gid: int
    side: str  # "baseline" | "distributed"
    ins: Instruction
    operands: list[int]
    sig: Sig | None = None


@dataclass
class Unsupported:
    side: str
    instruction: str
    opcode: str
    reason: str
    line: int | None


@dataclass
class Graphs:
    spec: RelationSpec
    baseline: Module
    distributed: Module
    nodes: list[Node] = field(default_factory=list)
    by_name: dict[tuple[str, str], int] = field(default_factory=dict)
    rows: dict[str, list[tuple[object, ...]]] = field(default_factory=dict)
    tables: Tables | None = None
    unsupported: list[Unsupported] = field(default_factory=list)

    def node(self, side: str, name: str) -> Node:
        return self.nodes[self.by_name[(side, name)]]


def _groups_ok(ins: Instruction, spec: RelationSpec) -> bool:
    groups = ins.parsed.get("replica_groups")
    if groups is None:
        return False
    if groups == []:
        # XLA: empty replica_groups means one group of all replicas.
        return len(spec.groups) == 1 and spec.groups[0] == list(range(len(spec.groups[0])))
    return [list(g) for g in groups] == [list(g) for g in spec.groups]


def _literal_key(ins: Instruction) -> str:
    lit = " ".join((ins.literal or "").split())
    if len(lit) > 200:
        lit = "sha1:" + hashlib.sha1(lit.encode()).hexdigest()
    return f"const|{ins.shape.dtype}[{'x'.join(map(str, ins.shape.dims))}]|{lit}"


def build(spec: RelationSpec, baseline: Module, distributed: Module, rank_params: set[str]) -> Graphs:
    g = Graphs(spec, baseline, distributed)
    tables = Tables(spec.c)
    g.tables = tables
    rows: dict[str, list[tuple[object, ...]]] = {k: [] for k in ("leafrow", "litrow", "urow", "brow", "trow", "vrow", "nilrow", "consrow", "rankrow", "commutative", "mirror", "layoutop", "ew", "scalarfill")}
    for d in range(8):
        rows.setdefault("kind-sh", []).append((f"s:{d}", d))
        rows.setdefault("kind-plain", []).append((f"s:{d}",))
    rows["kind-plain"].append(("dup",))
    rows["kind-p"] = [(f"p:{op}", op) for op in ("add", "max", "min")]
    block_specs = {b.relation.blocks for b in spec.inputs if b.relation.blocks}
    list_id = [0]

    def new_list(items: list[int]) -> int:
        lid = list_id[0]
        list_id[0] += 1
        rows["nilrow"].append((lid,))
        for item in reversed(items):
            nxt = list_id[0]
            list_id[0] += 1
            rows["consrow"].append((nxt, item, lid))
            lid = nxt
        return lid

    for side, module in (("baseline", baseline), ("distributed", distributed)):
        comp: Computation = module.entry
        for ins in comp.instructions:
            gid = len(g.nodes)
            operands = [g.by_name[(side, o)] for o in ins.operands]
            node = Node(gid, side, ins, operands)
            g.nodes.append(node)
            g.by_name[(side, ins.name)] = gid
            _check_supported(g, side, ins, module)
            if ins.opcode == "parameter":
                rows["leafrow"].append((gid,))
                if side == "distributed" and ins.name in rank_params:
                    rows["rankrow"].append((gid,))
                continue
            opnd_shapes = [g.nodes[o].ins.shape for o in operands]
            if ins.opcode == "constant":
                rows["litrow"].append((gid, _literal_key(ins)))
                continue
            groups_ok = _groups_ok(ins, spec) if ins.opcode in COLLECTIVES else None
            sig = make_sig(ins, opnd_shapes, groups_ok)
            node.sig = sig
            key = sig.key()
            if not operands:
                rows["litrow"].append((gid, key))  # iota, replica-id are literal-like leaves
            elif len(operands) == 1 and ins.opcode not in ("concatenate", "tuple"):
                rows["urow"].append((gid, key, operands[0]))
            elif len(operands) == 2 and ins.opcode not in ("concatenate", "tuple", "dynamic-slice"):
                rows["brow"].append((gid, key, operands[0], operands[1]))
                if ins.opcode in COMMUTATIVE and opnd_shapes[0] == opnd_shapes[1]:
                    rows["commutative"].append((key,))
                if ins.opcode == "compare" and opnd_shapes[0] == opnd_shapes[1]:
                    d = ins.parsed.get("direction")
                    if isinstance(d, str) and d in MIRROR:
                        mirrored = make_sig(_with_direction(ins, MIRROR[d]), opnd_shapes).key()
                        rows["mirror"].append((key, mirrored))
            elif len(operands) == 3 and ins.opcode in ("select", "clamp"):
                rows["trow"].append((gid, key, *operands))
            else:
                rows["vrow"].append((gid, key, new_list(operands)))
            if ins.opcode in ("reshape", "transpose"):
                rows["layoutop"].append((key,))
            if ins.opcode in POINTWISE:
                rows["ew"].append((key, sig.pointwise_name()))
            if ins.opcode == "broadcast" and opnd_shapes[0].dims == ():
                rows["scalarfill"].append((key,))
            if side == "baseline":
                init = None
                if ins.opcode == "reduce" and len(operands) == 2:
                    init_ins = g.nodes[operands[1]].ins
                    init = init_ins.literal if init_ins.opcode == "constant" else None
                tables.baseline(sig, ins, init, block_specs)
            elif ins.opcode in COLLECTIVES:
                tables.distributed(sig, ins, bool(groups_ok))
    rows.update({k: sorted(v, key=repr) for k, v in tables.rows.items()})
    g.rows = rows
    return g


def _with_direction(ins: Instruction, direction: str) -> Instruction:
    from dataclasses import replace

    parsed = dict(ins.parsed, direction=direction)
    attrs = dict(ins.attrs, direction=direction)
    return replace(ins, parsed=parsed, attrs=attrs)


def _check_supported(g: Graphs, side: str, ins: Instruction, module: Module) -> None:
    line = ins.loc.line if ins.loc else None

    def unsupported(reason: str) -> None:
        g.unsupported.append(Unsupported(side, ins.name, ins.opcode, reason, line))

    if ins.opcode not in KNOWN:
        unsupported(f"opcode '{ins.opcode}' has no rules")
        return
    if ins.shape.is_tuple and ins.opcode != "tuple":
        unsupported("tuple-shaped results are only understood for split all-reduces and get-tuple-element")
    reducer = ins.parsed.get("reducer")
    if isinstance(reducer, str) and reducer.startswith("computation:"):
        unsupported(f"reducer computation {reducer.split(':', 1)[1]} is not a plain add/max/min/mul/and/or")
    if ins.opcode == "custom-call":
        target = ins.parsed.get("custom_call_target", "")
        if target not in g.spec.custom_calls:
            unsupported(f"custom-call target '{target}' is not declared in the relations file (custom_calls)")
    if ins.opcode == "scatter":
        unsupported("scatter has no rules yet")
    if ins.opcode in ("all-to-all", "collective-permute") and side == "baseline":
        unsupported("a collective in the baseline graph")
    if ins.opcode in BINARY_POINTWISE and len(ins.operands) != 2:
        unsupported(f"{ins.opcode} with {len(ins.operands)} operands")


def shape_of(s: Shape) -> str:
    return str(s)
