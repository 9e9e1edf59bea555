"""Turn the two normalized entry computations into e-graph rows and shape tables.

Node ids are global: baseline instructions first, then distributed ones, so one e-graph holds
both graphs and every fact can name either side.

Side conditions the value tables here check (audit, issue 23): integer iotas and arange
literals count 0..n-1 only while n - 1 fits their type (iota_exact; float iotas while exact
in the significand), for the position (iotaval), index (iotadim) and range tables alike;
integer arithmetic rows carry the result type's exact range (intop, intshl, numconv, intconv:
every rule that uses them checks no value wraps); converts carry values only when they keep
every value (intwiden/intwidento) or when the rule checks the values fit (numconv, ftoi);
compares decided by ranges are int compares (cmpop) or exact float constants (fcmpop).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..hlo.literals import ASSUMED_EQUAL, INT_BITS
from ..hlo.parser import literal_is_elided
from ..ir import Computation, Instruction, Module
from ..relations import RelationSpec
from .laws import FAMILIES, InstructionHook, all_tables
from .laws.argreduce import arg_reducer
from .laws.core import custom_call_problem
from .ops import (
    BINARY_POINTWISE,
    COLLECTIVES,
    COMMUTATIVE,
    KNOWN,
)
from .ranges import Ranges, fits_int, guarded_fits_int
from .scatter import read_scatter
from .signature import Sig, make_sig

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
    unsupported: list[Unsupported] = field(default_factory=list)
    ranges: dict[int, Ranges] = field(default_factory=dict)  # value ranges per module (id)
    rank_params: set[str] = field(default_factory=set)  # the distributed rank inputs (in [0, c))
    memo: dict[str, object] = field(default_factory=dict)  # what several law families derive once

    def node(self, side: str, name: str) -> Node:
        return self.nodes[self.by_name[(side, name)]]


def _groups_ok(ins: Instruction, spec: RelationSpec) -> bool:
    groups = ins.parsed.get("replica_groups")
    if groups is None:
        return False
    if groups == []:
        # XLA: empty replica_groups means one group of all replicas.
        return len(spec.groups) == 1 and spec.groups[0] == list(range(len(spec.groups[0])))
    if ins.opcode == "all-reduce":
        # A sum (max, min) over a group is the same whatever order its ranks, or the groups,
        # are listed in; all-gather and reduce-scatter place blocks by that order.
        return sorted(sorted(g) for g in groups) == sorted(sorted(g) for g in spec.groups)
    return [list(g) for g in groups] == [list(g) for g in spec.groups]


def _literal_key(ins: Instruction, gid: int) -> str:
    """The literal term's key: equal keys are one value in both graphs. An elided literal
    (``{...}``) is an unknown value, so its key is its own node's: equal to no other literal,
    not even another elided one of the same shape (two different tables would otherwise be
    one; found by review: x * cos(arange(0, 16) * 0.1) against arange(1, 17) verified)."""
    if literal_is_elided(ins.literal):
        if ins.parsed.get(ASSUMED_EQUAL):  # the user's assumption: one value with its namesake (hlo.literals)
            return f"const|{ins.shape.dtype}[{'x'.join(map(str, ins.shape.dims))}]|assumed-equal:{ins.parsed[ASSUMED_EQUAL]}"
        return f"const|{ins.shape.dtype}[{'x'.join(map(str, ins.shape.dims))}]|elided#{gid}"
    lit = " ".join((ins.literal or "").split())
    if len(lit) > 200:
        lit = "sha1:" + hashlib.sha1(lit.encode()).hexdigest()
    return f"const|{ins.shape.dtype}[{'x'.join(map(str, ins.shape.dims))}]|{lit}"


# The term rows every family's rules match on (rules/core.egg); the families add their tables.
ROW_TABLES = ("leafrow", "litrow", "urow", "brow", "trow", "vrow", "nilrow", "consrow", "rankrow", "commutative", "mirror")


def build(spec: RelationSpec, baseline: Module, distributed: Module, rank_params: set[str], with_rows: bool = True, folded: frozenset[tuple[str, str]] = frozenset()) -> Graphs:
    """Nodes, signatures and unsupported-op checks; with ``with_rows``, also the e-graph rows:
    the terms, and every registered law family's tables (engine/analysis/laws; skipped for the
    whole graph when it is solved segment by segment). ``folded`` names the (side, instruction)
    placeholders of folded layers (hlo.fold): nodes without signature or rows, related only by
    proofs of their own blocks."""
    g = Graphs(spec, baseline, distributed)
    g.rank_params = set(rank_params)
    rows: dict[str, list[tuple[object, ...]]] = {k: [] for k in ROW_TABLES}
    rows["groupsize"] = [(spec.c,)]
    families = FAMILIES if with_rows else []
    for t in all_tables() if with_rows else ():  # a left-out family's too: other hooks may fill them
        rows.setdefault(t, [])
    per_opcode: dict[str, list[InstructionHook]] = {}
    every_opcode = [f.instruction_rows for f in families if f.instruction_rows is not None and f.opcodes is None]
    visits = [v for f in families if f.walk is not None and (v := f.walk(rows, g)) is not None]
    list_id = [0]

    def hooks(opcode: str) -> list[InstructionHook]:
        got = per_opcode.get(opcode)
        if got is None:
            got = per_opcode[opcode] = [f.instruction_rows for f in families if f.instruction_rows is not None and f.opcodes is not None and opcode in f.opcodes] + every_opcode
        return got

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
            if (side, ins.name) in folded:
                continue
            _check_supported(g, side, ins, module)
            if ins.opcode == "parameter":
                rows["leafrow"].append((gid,))
                if side == "distributed" and ins.name in rank_params:
                    rows["rankrow"].append((gid,))
                continue
            opnd_shapes = [g.nodes[o].ins.shape for o in operands]
            if ins.opcode == "constant":
                lkey = _literal_key(ins, gid)
                rows["litrow"].append((gid, lkey))  # a literal term shared by both graphs
                for visit in visits:
                    visit(node, lkey, None, [])
                continue
            groups_ok = _groups_ok(ins, spec) if ins.opcode in COLLECTIVES else None
            sig = make_sig(ins, opnd_shapes, groups_ok)
            node.sig = sig
            if not with_rows:
                continue
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
            for hook in hooks(ins.opcode):
                hook(rows, side, sig, ins, opnd_shapes, spec.c)
            for visit in visits:
                visit(node, key, sig, opnd_shapes)
    for fam in families:
        if fam.graph_rows is not None:
            fam.graph_rows(rows, g)
    for k in ("commutative", *(t for f in families for t in f.tables)):
        rows[k] = sorted(set(rows[k]), key=repr)
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
    callee = ins.parsed.get("to_apply")
    called = module.computations.get(callee) if isinstance(callee, str) else None
    if called is not None and any(literal_is_elided(c.literal) for c in called.instructions if c.opcode == "constant"):
        # Reducers and comparators are compared by their body text, where two elided
        # literals would read the same.
        unsupported(f"the computation %{callee} it calls has a constant printed as {{...}}, its values left out of the text. {ELIDED_HINT}")
    if ins.shape.is_tuple and ins.opcode not in ("tuple", "sort", "topk") and arg_reducer(module, ins) is None:
        unsupported("tuple-shaped results are only understood for tuple, sort, topk, split all-reduces and argmax/argmin reduces")
    reducer = ins.parsed.get("reducer")
    if isinstance(reducer, str) and reducer.startswith("body:") and ins.opcode not in ("reduce", "scatter"):  # scatter: read_scatter below
        unsupported(f"{ins.opcode} with a reducer that is not a plain add/max/min/mul/and/or")
    if ins.opcode == "convert" and ins.operands and ins.shape.dtype in INT_BITS:
        src = module.entry.get(ins.operands[0])
        if src is not None and src.shape.dtype not in INT_BITS and src.shape.dtype != "pred" and not _fits_int(g, module, src, ins.shape.dtype, ins):
            # Out-of-range float->int converts are implementation-defined: XLA:CPU gives
            # different answers for the same value in differently shaped (vectorized) programs.
            # Exception: values provably in range (analysis.ranges), such as torch's
            # floor(float(rank) / k) for a rank-selected index or a clamped bucket position.
            unsupported(f"convert {src.shape.dtype}->{ins.shape.dtype} is implementation-defined for out-of-range values")
    if ins.opcode == "custom-call":
        target = ins.parsed.get("custom_call_target", "")
        if target not in g.spec.custom_calls:
            unsupported(f"custom-call target '{target}' is not declared in the relations file (custom_calls)")
        else:
            problem = custom_call_problem(g.spec.custom_calls[target], (ins.shape.dtype, tuple(ins.shape.dims)), [(o.shape.dtype, tuple(o.shape.dims)) for o in (module.entry.get(x) for x in ins.operands) if o is not None])
            if problem:
                unsupported(problem)
    if ins.opcode == "scatter":
        shapes = [o.shape for o in (module.entry.get(x) for x in ins.operands) if o is not None]
        form = read_scatter(ins, shapes, module)
        if isinstance(form, str):
            unsupported(form)
    if ins.opcode in COLLECTIVES and side == "baseline":
        unsupported("a collective in the baseline (single-device) graph")
    if ins.opcode in ("replica-id", "partition-id"):
        unsupported(f"{ins.opcode} differs per rank; declare the rank as an s32[] input with relation 'rank' instead")
    if ins.opcode in BINARY_POINTWISE and len(ins.operands) != 2:
        unsupported(f"{ins.opcode} with {len(ins.operands)} operands")


def _fits_int(g: Graphs, module: Module, src: Instruction, dtype: str, conv: Instruction | None = None) -> bool:
    """Every value ``src`` (a float) can hold converts to the int ``dtype`` in range (the value
    range analysis of analysis.ranges, one memo per module)."""
    ranges = g.ranges.get(id(module))
    if ranges is None or ranges.module is not module:
        # The rank input of the distributed program is its index in the group: [0, c - 1].
        seeds = {name: (0, g.spec.c - 1) for name in g.rank_params} if module is g.distributed else {}
        ranges = g.ranges[id(module)] = Ranges(module, seeds)
    # Or the out-of-range values are dropped by a select guarding them (analysis.ranges).
    return fits_int(ranges, src, dtype) or (conv is not None and guarded_fits_int(ranges, conv))


# How to get the values of an elided literal: said wherever one stops a proof.
ELIDED_HINT = (
    "Dump the HLO with every constant in full: `shardproof build` writes them; from torch-xla, print the proto "
    "of `torch_xla._XLAC._get_xla_tensors_hlo_proto(tensors)` with jaxlib's "
    "`XlaComputation(proto).as_hlo_text(print_large_constants=True)` (`_get_xla_tensors_hlo` "
    "elides constants of more than 10 elements); from XLA dumps, add `--xla_dump_large_constants` "
    "to XLA_FLAGS (with `--xla_dump_to=DIR --xla_dump_hlo_as_text`); from JAX, "
    "`jax.jit(f).lower(...).compiler_ir('hlo').as_hlo_text(print_large_constants=True)`"
)


def elided_constants(g: Graphs, roots: list[tuple[str, str]]) -> list[Unsupported]:
    """The elided constants (``constant({...})``) that the instructions ``roots`` ((side,
    name) pairs) are computed from, as unsupported entries: a proof about those roots needs
    values the text does not hold, so not relating them is no evidence of a divergence."""
    seen: set[int] = set()
    stack = [g.by_name[r] for r in roots if r in g.by_name]
    found: list[Unsupported] = []
    while stack:
        gid = stack.pop()
        if gid in seen:
            continue
        seen.add(gid)
        n = g.nodes[gid]
        if n.ins.opcode == "constant" and literal_is_elided(n.ins.literal) and not n.ins.parsed.get(ASSUMED_EQUAL):
            line = n.ins.loc.line if n.ins.loc else None
            found.append(Unsupported(n.side, n.ins.name, "constant", f"constant {n.ins.shape} is printed as {{...}}: its values are not in the text, so no proof can use them", line))
        stack.extend(n.operands)
    return sorted(found, key=lambda u: (u.side != "distributed", u.line or 0, u.instruction))

