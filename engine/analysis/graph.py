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
import math
from dataclasses import dataclass, field

from ..hlo.literals import ASSUMED_EQUAL, FLOAT_MAX, int_range, is_int_value, scalar_value
from ..hlo.parser import literal_is_elided
from ..ir import Computation, Instruction, Module, Shape
from ..relations import RelationSpec
from .laws import FAMILIES
from .laws import tables as law_tables
from .ops import (
    BINARY_POINTWISE,
    COLLECTIVES,
    COMMUTATIVE,
    KNOWN,
    TERNARY_POINTWISE,
    UNARY_POINTWISE,
)
from .padded import PadTables, rows_pick, seed_pairs
from .ranges import Ranges, fits_int
from .scatter import (
    SCATTER_TABLES,
    group_partial_rows,
    read_scatter,
    scatter_group_factors,
    scatter_rows,
)
from .signature import Sig, make_sig
from .tables import GroupTables, Tables, custom_call_problem, merged_blocks, merged_run_blocks

POINTWISE = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1  # the range of egglog's i64 column

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
    ranges: dict[int, Ranges] = field(default_factory=dict)  # value ranges per module (id)
    rank_params: set[str] = field(default_factory=set)  # the distributed rank inputs (in [0, c))

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


ROW_TABLES = (
    "leafrow", "litrow", "urow", "brow", "trow", "vrow", "nilrow", "consrow", "rankrow", "commutative",
    "mirror", "layoutop", "ew", "scalarbcast", "litint", "zerolit", "intop", "intwiden", "cmpop",
    "orop", "boolconv", "selectop", "gathershard", "maskfor", "dsliceat", "identlit", "falselit",
    "onelit", "fillop", "mulop", "addop", "prednefalse", "dotop", "sliceblock", "intconv",
    "reshapeback", "transposeback", "itof", "ftoi", "fdivop", "floorop", "onelem", "intdiv",
    "litfint", "gatherpick", "repeatbc", "mergenext", "unitbcast", "keepsvals",
    "argred", "iotadim", "gteidx", "intwidento", "redone", "cmpeq", "affmove", "unitdim",
    "litrecip", "maskunflat", "catdim", "predtof",
    "iotaval", "numconv", "gatherrows", "intshl", "padop", "truelit", "andop", "andreduce", "dusat", "farith", "fcmpop", "extop", "perrank", "fnegop", "reduceflip", "maskforr", "sortmoves", "gtemoves", "sortarray", "ringop", "bcastlead", "unitmove",
    *SCATTER_TABLES,
    *law_tables(),  # the registered law families (engine/analysis/laws)
)  # fmt: skip


def build(spec: RelationSpec, baseline: Module, distributed: Module, rank_params: set[str], with_rows: bool = True, folded: frozenset[tuple[str, str]] = frozenset()) -> Graphs:
    """Nodes, signatures and unsupported-op checks; with ``with_rows``, also the e-graph rows
    and shape tables (skipped for the whole graph when it is solved segment by segment).
    ``folded`` names the (side, instruction) placeholders of folded layers (hlo.fold): nodes
    without signature or rows, related only by proofs of their own blocks."""
    g = Graphs(spec, baseline, distributed)
    g.rank_params = set(rank_params)
    tables = Tables(spec.c)
    g.tables = tables
    groups = GroupTables(tables, _group_factors(distributed, spec.c))
    pads = PadTables(tables, seed_pairs(_padded_inputs(spec, baseline), distributed.entry.instructions, spec.c))
    rows: dict[str, list[tuple[object, ...]]] = {k: [] for k in ROW_TABLES}
    rows["groupsize"] = [(spec.c,)]
    for d in range(8):
        rows.setdefault("kind-sh", []).append((f"s:{d}", d))
        rows.setdefault("kind-plain", []).append((f"s:{d}",))
    rows["kind-plain"].append(("dup",))
    rows["kind-p"] = [(f"p:{op}", op) for op in ("add", "max", "min")]
    # Rank-group kinds of the layout family (rules/layout.egg, grp under a layout): only for
    # the group factors the distributed graph selects with, so other programs pay nothing.
    rows["kind-g"] = [(f"g:{d}:{k}", d, k) for d in range(8) for k in groups.factors]
    block_specs = {b.relation.blocks for b in spec.inputs if b.relation.blocks}
    # Fused dims made by merging a duplicate dim with a sharded one (rules/partition.egg,
    # merge-blocks): constants broadcast into them need the same block spec.
    for ins in baseline.entry.instructions:
        if ins.opcode == "reshape" and ins.operands:
            src = baseline.entry.get(ins.operands[0])
            if src is not None:
                block_specs.update(b for _d, _e, b in merged_blocks(tuple(src.shape.dims), tuple(ins.shape.dims), spec.c))
                block_specs.update(b for _d, _e, b in merged_run_blocks(tuple(src.shape.dims), tuple(ins.shape.dims), spec.c))
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
                _literal_rows(rows, gid, ins)
                _rpos_tables(rows, ins, _literal_key(ins, gid), [], spec.c)
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
            _class_rows(rows, key, sig, ins, opnd_shapes)
            if side == "distributed" and ins.opcode == "reshape":
                bkey = _unit_reshape_broadcast(sig)
                if bkey is not None:
                    rows["unitbcast"].append((key, bkey))
            _rank_tables(rows, side, node, sig, opnd_shapes, g, spec.c)
            _rpos_tables(rows, ins, key, opnd_shapes, spec.c, side, sig)
            if side == "distributed" and ins.opcode == "gather" and len(opnd_shapes) == 2:
                pick = rows_pick(ins, tuple(opnd_shapes[0].dims), tuple(opnd_shapes[1].dims), spec.c)
                if pick is not None:  # rules/padded.egg
                    tables.add("padrows", key, pick[0], pick[1], _shape_text(opnd_shapes[1].dtype, tuple(opnd_shapes[1].dims)))
            _arg_tables(rows, node, sig, opnd_shapes, module)
            if ins.opcode == "scatter":
                scatter_rows(rows, side, sig, ins, opnd_shapes, spec.c)  # rules/scatter.egg
            for fam in FAMILIES:  # the registered law families (engine/analysis/laws)
                if fam.instruction_rows is not None and (fam.opcodes is None or ins.opcode in fam.opcodes):
                    fam.instruction_rows(rows, side, sig, ins, opnd_shapes, spec.c)
            if ins.opcode == "concatenate" and len(operands) == 1:
                rows["catone"].append((key,))  # rules/scatter.egg
            if side == "baseline" and groups.factors:
                zeros = [g.nodes[o].ins.opcode == "constant" and _scalar_value(g.nodes[o].ins) == 0 for o in operands]
                group_partial_rows(rows, sig, ins, [d for _, d in sig.ins], sig.out[1], groups.factors, spec.c, zeros)
            if ins.opcode == "custom-call" and ins.parsed.get("custom_call_target") in spec.custom_calls:
                tables.custom_call(sig, spec.custom_calls[ins.parsed["custom_call_target"]], side == "baseline")
            if ins.opcode == "broadcast":
                tables.unit_broadcast(sig, ins, side == "baseline")  # rules/layout.egg ubcast
            if side == "baseline":
                init: list[str] = []
                if ins.opcode == "reduce" and len(operands) == 2:
                    init_ins = g.nodes[operands[1]].ins
                    init = _identity_of(init_ins, _scalar_value(init_ins))
                tables.baseline(sig, ins, init, block_specs)
                pads.baseline(sig, ins, bool(init) and ins.parsed.get("reducer") in init)
                if groups.factors:
                    groups.baseline(sig, ins, [d for _, d in sig.ins], sig.out[1])
            elif ins.opcode == "collective-permute":
                tables.permute(sig, ins, spec.groups)
            elif ins.opcode in COLLECTIVES:
                tables.distributed(sig, ins, bool(groups_ok))
    _mask_tables(rows, g)
    _unflat_mask_tables(rows, g)
    _unit_row_mask_tables(rows, g)
    _round_trip_rows(rows, g)
    if with_rows:
        for fam in FAMILIES:
            if fam.graph_rows is not None:
                fam.graph_rows(rows, g)
    for k in (*SCATTER_TABLES, *law_tables()):
        rows[k] = sorted(set(rows[k]), key=repr)
    rows.update({k: sorted(v, key=repr) for k, v in tables.rows.items()})
    for k in ("argred", "iotadim", "gteidx", "intwidento", "redone", "cmpeq", "affmove", "unitdim", "keepsvals", "itof", "ftoi", "fdivop", "floorop", "onelem", "intdiv", "litfint", "repeatbc", "mergenext", "intconv", "sliceblock", "fillop", "mulop", "addop", "prednefalse", "identlit", "litint", "zerolit", "intop", "intwiden", "cmpop", "orop", "boolconv", "selectop", "scalarbcast", "layoutop", "ew", "commutative"):
        rows[k] = sorted(set(rows[k]), key=repr)
    g.rows = rows
    return g


def _padded_inputs(spec: RelationSpec, baseline: Module) -> list[tuple[int, int]]:
    """(n, w) of every padded input: the baseline parameter's extent along dim, the width."""
    out = []
    params = {p.parameter_number: p for p in baseline.entry.parameters} | {p.name: p for p in baseline.entry.parameters}
    for b in spec.inputs:
        r = b.relation
        if r.kind == "padded" and r.width and b.baseline is not None:
            p = params.get(b.baseline if isinstance(b.baseline, int) else b.baseline.lstrip("%"))
            if p is not None and r.dim is not None and r.dim < len(p.shape.dims):
                out.append((p.shape.dims[r.dim], r.width))
    return out


def _round_trip_rows(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    """Pairs of reshape (transpose) signatures where the second undoes the first."""
    reshapes: dict[tuple[str, tuple[int, ...], tuple[int, ...]], set[str]] = {}
    transposes: dict[tuple[str, tuple[int, ...], tuple[int, ...]], set[str]] = {}
    for n in g.nodes:
        if n.sig is None or n.ins.opcode not in ("reshape", "transpose"):
            continue
        (dtype, src), (_, dst) = n.sig.ins[0], n.sig.out
        if n.ins.opcode == "reshape":
            reshapes.setdefault((dtype, src, dst), set()).add(n.sig.key())
        else:
            perm = tuple(n.ins.parsed.get("dimensions", []))
            transposes.setdefault((dtype, src, perm), set()).add(n.sig.key())
    for (dtype, src, dst), firsts in reshapes.items():
        for k1 in firsts:
            for k2 in reshapes.get((dtype, dst, src), ()):
                rows["reshapeback"].append((k1, k2))
    for (dtype, src, perm), firsts in transposes.items():
        inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
        mid = tuple(src[p] for p in perm)
        for k1 in firsts:
            for k2 in transposes.get((dtype, mid, inverse), ()):
                rows["transposeback"].append((k1, k2))


def _literal_rows(rows: dict[str, list[tuple[object, ...]]], gid: int, ins: Instruction) -> None:
    """A constant is a literal term shared by both graphs, plus what its value is an identity,
    zero, one, false or integer for."""
    lkey = _literal_key(ins, gid)
    rows["litrow"].append((gid, lkey))
    value = _scalar_value(ins)
    for op in _identity_of(ins, value):
        rows["identlit"].append((lkey, op))
    if ins.shape.dims == () and (ins.literal or "").strip() == "false":
        rows["falselit"].append((lkey,))
    if value is not None:
        if value == 0:
            rows["zerolit"].append((lkey,))
        if value == 1:
            rows["onelit"].append((lkey,))
        # egglog's int column is i64: a u64 beyond it stays an opaque literal (no rule
        # computes with it; it is still the same value on every rank).
        if ins.shape.dtype in INT_BITS and is_int_value(value) and I64_MIN <= value <= I64_MAX:
            rows["litint"].append((lkey, value))
        p = FLOAT_PRECISION.get(ins.shape.dtype)
        if p is not None and math.isfinite(value) and abs(value) <= 2.0**p and value == int(value):
            rows["litfint"].append((lkey, int(value)))
        if p is not None and 0 < value < 1 and math.isfinite(value):
            # 1/n exactly (n a power of two, so the literal is exact): x * (1/n) is x / n
            # (rules/rankalgebra.egg). A rounded reciprocal such as fl(1/3) is not 1/3.
            m, e = math.frexp(value)
            if m == 0.5 and -e + 1 <= 62:
                rows["litrecip"].append((lkey, 1 << (1 - e)))


def _class_rows(rows: dict[str, list[tuple[object, ...]]], key: str, sig: Sig, ins: Instruction, opnd: list[Shape]) -> None:
    """Which op classes a signature belongs to, for rules that match a class of operators."""
    op = ins.opcode
    if op in ("reshape", "transpose"):
        rows["layoutop"].append((key,))
    if op in ("reshape", "transpose", "broadcast", "copy", "slice"):
        rows["keepsvals"].append((key,))
    if op in POINTWISE:
        rows["ew"].append((key, sig.pointwise_name()))
    if op == "broadcast" and opnd[0].dims == ():
        rows["scalarbcast"].append((key,))
    if op in ("broadcast", "reshape", "convert", "copy") and (op != "broadcast" or opnd[0].dims == ()):
        rows["fillop"].append((key,))
    if op == "multiply":
        rows["mulop"].append((key,))
    if op == "add":
        rows["addop"].append((key,))
    if op == "dot":
        rows["dotop"].append((key,))
    if op == "reduce" and len(opnd) == 2:
        rows.setdefault("reduceop", []).append((key,))  # rules/layout.egg: a reduce under a layout
    if op == "broadcast" and opnd and len(ins.shape.dims) == len(opnd[0].dims) + 1 and list(ins.parsed.get("dimensions", [])) == sorted(ins.parsed.get("dimensions", [])):
        rows.setdefault("bcastone", []).append((key,))  # rules/layout.egg: one new dim, the others in order
    if op in ("subtract", "exponential") and ins.shape.dtype in FLOAT_PRECISION:
        rows["ringop"].append((key, op))  # rules/ring.egg: the online-softmax rescale
    if op == "broadcast" and opnd and list(ins.parsed.get("dimensions", [])) == list(range(len(opnd[0].dims))):
        rows["bcastlead"].append((key,))  # rules/ring.egg: a row value repeated along trailing dims
    if op == "pad":
        rows["padop"].append((key,))  # rules/scaling.egg: a pad with zeros is linear
    if op == "slice":
        rows["sliceblock"].extend(_slice_blocks(key, ins, opnd[0].dims))
    if op == "broadcast" and opnd:
        rows["repeatbc"].extend(_repeat_broadcast(key, ins, opnd[0].dims))
    if op == "reshape" and opnd:
        src, out = opnd[0].dims, ins.shape.dims
        for d in range(len(src) - 1):
            if out == (*src[:d], src[d] * src[d + 1], *src[d + 2 :]):
                rows["mergenext"].append((key, d))
    if op == "compare" and ins.parsed.get("direction") == "NE" and opnd[0].dtype == "pred":
        rows["prednefalse"].append((key,))
    if op == "concatenate" and len(ins.parsed.get("dimensions", [])) == 1:
        rows["catdim"].append((key, int(ins.parsed["dimensions"][0])))  # rules/gathercat.egg


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
    if ins.shape.is_tuple and ins.opcode not in ("tuple", "sort") and arg_reducer(module, ins) is None:
        unsupported("tuple-shaped results are only understood for tuple, sort, split all-reduces and argmax/argmin reduces")
    reducer = ins.parsed.get("reducer")
    if isinstance(reducer, str) and reducer.startswith("body:") and ins.opcode not in ("reduce", "scatter"):  # scatter: read_scatter below
        unsupported(f"{ins.opcode} with a reducer that is not a plain add/max/min/mul/and/or")
    if ins.opcode == "convert" and ins.operands and ins.shape.dtype in INT_BITS:
        src = module.entry.get(ins.operands[0])
        if src is not None and src.shape.dtype not in INT_BITS and src.shape.dtype != "pred" and not _fits_int(g, module, src, ins.shape.dtype):
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


# Significand precision: every integer of magnitude <= 2**p is exactly representable.
FLOAT_PRECISION = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


def _fits_int(g: Graphs, module: Module, src: Instruction, dtype: str) -> bool:
    """Every value ``src`` (a float) can hold converts to the int ``dtype`` in range (the value
    range analysis of analysis.ranges, one memo per module)."""
    ranges = g.ranges.get(id(module))
    if ranges is None or ranges.module is not module:
        # The rank input of the distributed program is its index in the group: [0, c - 1].
        seeds = {name: (0, g.spec.c - 1) for name in g.rank_params} if module is g.distributed else {}
        ranges = g.ranges[id(module)] = Ranges(module, seeds)
    return fits_int(ranges, src, dtype)


def shape_of(s: Shape) -> str:
    return str(s)


def _slice_blocks(key: str, ins: Instruction, src: tuple[int, ...]) -> list[tuple[object, ...]]:
    """sliceblock rows: the slice takes exactly one block along one dim, whole extents elsewhere."""
    sl = [tuple(x) for x in ins.parsed.get("slice", [])]
    if len(sl) != len(src):
        return []
    cut = [d for d, (a, b, st) in enumerate(sl) if (a, b, st) != (0, src[d], 1)]
    if not cut:
        # The whole tensor (y[0:1] of a rank's single expert): block 0 of 1 along any dim.
        return [(key, d, 0, n, 1) for d, n in enumerate(src) if n > 0]
    if len(cut) != 1:
        return []
    d = cut[0]
    start, limit, stride = sl[d]
    size = limit - start
    if stride != 1 or size <= 0 or src[d] % size or start % size or src[d] // size > 62:
        return []
    return [(key, d, start // size, size, src[d] // size)]


def _scalar_value(ins: Instruction) -> int | float | None:
    """The exact value of a scalar int or float constant (hlo.literals): an int of its type,
    or the float of its type as a double. None for pred, opaque types and non-scalars."""
    if ins.opcode != "constant" or ins.shape.dims != () or ins.shape.is_tuple:
        return None
    v = scalar_value(ins.shape.dtype, ins.literal)
    return None if isinstance(v, bool) else v


def _identity_of(ins: Instruction, value: int | float | None) -> list[str]:
    """Reducers this scalar literal is an identity of, compared exactly. For floats the lowest
    finite value counts for max (and the highest for min): torch lowers amax with it, and it is
    the identity on finite inputs. For ints the type's minimum is the identity of max and its
    maximum that of min (torch's amin/amax on s64 start from them)."""
    if value is None or ins.shape.dims != ():
        return []
    dtype = ins.shape.dtype
    out = []
    if value == 0:
        out.append("add")
    if value == 1:
        out.append("mul")
    if dtype in INT_BITS:
        lo, hi = int_range(dtype)
        if value == lo:
            out.append("max")
        if value == hi:
            out.append("min")
    elif dtype in FLOAT_MAX:
        if value == -math.inf or value == -FLOAT_MAX[dtype]:
            out.append("max")
        if value == math.inf or value == FLOAT_MAX[dtype]:
            out.append("min")
    return out


INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def iota_exact(dtype: str, n: int) -> bool:
    """An iota of ``n`` elements along its dim holds exactly 0 .. n-1 in ``dtype``: for an int
    type n - 1 is at most the type's largest value (else it wraps: s8 counts 127, -128, ...),
    for a float type at most 2^(significand bits) (else rounding repeats values)."""
    if dtype in INT_BITS:
        return n - 1 <= int_range(dtype)[1]
    p = FLOAT_PRECISION.get(dtype)
    return p is not None and n - 1 <= 1 << p


def _widens(a: str, b: str) -> bool:
    """Every value of int type a is representable in int type b."""
    if a not in INT_BITS or b not in INT_BITS:
        return False
    if a[0] == b[0]:
        return INT_BITS[b] >= INT_BITS[a]
    return a[0] == "u" and b[0] == "s" and INT_BITS[b] > INT_BITS[a]


def _rank_tables(rows: dict[str, list[tuple[object, ...]]], side: str, node: Node, sig: Sig, opnd: list[Shape], g: Graphs, c: int) -> None:
    """Tables for the rank-arithmetic and vocab-parallel rules of rules/slicing.egg."""
    ins = node.ins
    key = sig.key()
    op = ins.opcode
    out_t = ins.shape.dtype
    if op in ("add", "subtract", "multiply", "remainder") and out_t in INT_BITS:
        rows["intop"].append((key, op, *_int_range(out_t)))
    elif op == "divide" and out_t in INT_BITS:
        rows["intdiv"].append((key, _int_top(out_t)))
    elif op == "divide" and out_t in FLOAT_PRECISION:
        rows["fdivop"].append((key,))
    elif op == "floor" and out_t in FLOAT_PRECISION:
        rows["floorop"].append((key,))
    elif op in ("reshape", "broadcast", "copy") and opnd and opnd[0].numel == 1 and ins.shape.numel == 1:
        rows["onelem"].append((key,))
    elif op == "convert" and opnd:
        a = opnd[0].dtype
        if a in INT_BITS and out_t in FLOAT_PRECISION:
            rows["itof"].append((key, 1 << FLOAT_PRECISION[out_t]))
        if a in FLOAT_PRECISION and out_t in INT_BITS:
            rows["ftoi"].append((key, _int_top(out_t)))
        if _widens(a, out_t):
            rows["intwiden"].append((key,))
        if a in INT_BITS and out_t in INT_BITS:
            bits = INT_BITS[out_t] - (1 if out_t[0] == "s" else 0)
            rows["intconv"].append((key, (1 << min(bits, 62)) - 1))
        if (a == "pred" and out_t in INT_BITS) or (a in INT_BITS and out_t == "pred"):
            rows["boolconv"].append((key,))
        if a == "pred" and out_t in FLOAT_PRECISION:
            rows["predtof"].append((key,))  # true -> 1.0, false -> 0.0 (rules/rankselect.egg)
    elif op == "compare" and opnd and opnd[0].dtype in INT_BITS:
        d = ins.parsed.get("direction")
        if isinstance(d, str):
            rows["cmpop"].append((key, d))
    elif op == "or" and out_t in ("pred", *INT_BITS):
        rows["orop"].append((key,))
    elif op == "select":
        rows["selectop"].append((key,))
    elif op == "gather" and side == "baseline" and len(opnd) == 2:
        src = opnd[0].dims
        p = ins.parsed
        sizes = list(p.get("slice_sizes", []))
        collapsed = list(p.get("collapsed_slice_dims", []))
        nb = ins.shape.rank - len(src)
        if ((collapsed == [0]
             # or the row kept as a unit dim, the offset dims trailing (XLA's compiled gathers)
             or (collapsed == [] and list(p.get("offset_dims", [])) == list(range(nb, nb + len(src)))))
                and list(p.get("start_index_map", [])) == [0]
                and src and src[0] % c == 0 and sizes == [1, *src[1:]]
                and (p.get("index_vector_dim") == len(opnd[1].dims)
                     # or an explicit index vector of one element (JAX: ids reshaped to [n, 1])
                     or (opnd[1].dims and opnd[1].dims[-1] == 1 and p.get("index_vector_dim") == len(opnd[1].dims) - 1))):
            w = src[0] // c
            kp = sig.with_dims([(w, *src[1:]), opnd[1].dims]).key()
            rows["gathershard"].append((key, kp, w))
    elif op == "gather" and side == "distributed" and len(opnd) == 2:
        d = _index_select_dim(ins, opnd[0].dims, opnd[1].dims)
        if d is not None:
            rows["gatherpick"].append((key, d, opnd[0].dims[d]))
    elif op == "dynamic-slice" and side == "distributed" and len(node.operands) >= 2:
        src = opnd[0].dims
        sizes = list(ins.parsed.get("dynamic_slice_sizes", []))
        idx = node.operands[1:]
        if len(sizes) == len(src) == len(idx):
            moving = [i for i, o in enumerate(idx) if _scalar_value(g.nodes[o].ins) != 0 or g.nodes[o].ins.opcode != "constant"]
            if len(moving) == 1:
                d = moving[0]
                if all(sizes[i] == src[i] for i in range(len(src)) if i != d) and sizes[d] * c == src[d]:
                    rows["dsliceat"].append((node.gid, node.operands[0], d, sizes[d], idx[d]))
    elif op == "dynamic-update-slice" and side == "distributed" and len(node.operands) >= 3:
        # dusat (rules/rankpos.egg): the update covers whole extents but along one dim d, where
        # it is 1/c of the operand's, at a start that may move; every other start literal 0.
        src, upd = opnd[0].dims, opnd[1].dims
        idx = node.operands[2:]
        if len(src) == len(upd) == len(idx):
            moving = [i for i, o in enumerate(idx) if _scalar_value(g.nodes[o].ins) != 0 or g.nodes[o].ins.opcode != "constant"]
            if len(moving) == 1:
                d = moving[0]
                if all(upd[i] == src[i] for i in range(len(src)) if i != d) and upd[d] * c == src[d]:
                    rows["dusat"].append((node.gid, node.operands[0], node.operands[1], d, upd[d], idx[d]))


def _shape_text(dtype: str, dims: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


def _arange_start(ins: Instruction) -> int | None:
    """b when the 1-D int constant ``ins`` is b, b+1, ..., b+n-1 (an arange literal)."""
    if ins.shape.dtype not in INT_BITS or len(ins.shape.dims) != 1 or literal_is_elided(ins.literal):
        return None
    text = (ins.literal or "").strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        vals = [int(v) for v in text[1:-1].replace(" ", "").split(",") if v]
    except ValueError:
        return None
    if len(vals) != ins.shape.dims[0] or not vals or any(v != vals[0] + i for i, v in enumerate(vals)):
        return None
    return vals[0] if I64_MIN <= vals[0] <= I64_MAX else None


def _rpos_tables(rows: dict[str, list[tuple[object, ...]]], ins: Instruction, key: str, opnd: list[Shape], c: int, side: str = "", sig: Sig | None = None) -> None:
    """Tables for rules/rankpos.egg: iota-like literals, exact converts from ints, row gathers
    at rank positions, integer shift-lefts, range-decided predicates, float rank arithmetic,
    max/min identities and negated extremes."""
    op, out = ins.opcode, ins.shape
    if op == "sort" and sig is not None and side == "baseline" and opnd and str(ins.parsed.get("is_stable", "")).lower() == "true":
        # rules/window.egg: a stable sort along e sorts every slice along e on its own.
        along = list(ins.parsed.get("dimensions", []))
        src = opnd[0].dims
        if len(along) == 1 and all(o.dims == src for o in opnd):
            for d, n in enumerate(src):
                if d != along[0] and n % c == 0 and n >= c:
                    si = (*src[:d], n // c, *src[d + 1 :])
                    kp = sig.with_dims([si] * len(opnd)).key() if out.is_tuple else sig.with_dims([si], si).key()
                    rows["sortmoves"].append((key, d, kp))
                    if not out.is_tuple:
                        rows["sortarray"].append((key,))
    if op == "get-tuple-element" and sig is not None and side == "baseline" and not out.is_tuple:
        for d, n in enumerate(out.dims):
            if n % c == 0 and n >= c:
                rows["gtemoves"].append((key, d, sig.with_dims(None, (*out.dims[:d], n // c, *out.dims[d + 1 :])).key()))
    if op == "negate" and out.dtype in FLOAT_PRECISION:
        rows["fnegop"].append((key,))
    if op == "reduce" and sig is not None and side == "baseline" and len(opnd) == 2 and out.dtype in FLOAT_PRECISION:
        dims = list(ins.parsed.get("dimensions", []))
        red = ins.parsed.get("reducer")
        if len(dims) == 1 and red in ("max", "min"):
            d = dims[0]
            n = opnd[0].dims[d]
            if n % c == 0 and n >= c:
                si = (*opnd[0].dims[:d], n // c, *opnd[0].dims[d + 1 :])
                flip = "min" if red == "max" else "max"
                rows["reduceflip"].append((key, d, red, sig.with_dims([si, opnd[1].dims], reducer=flip).key(), flip))
    here = _shape_text(out.dtype, tuple(out.dims))

    def per_rank(d: int) -> str:
        n = out.dims[d]
        return _shape_text(out.dtype, (*out.dims[:d], n // c, *out.dims[d + 1 :])) if n % c == 0 else "-"

    if op in ("iota", "constant", "convert", "reshape"):
        for d, n in enumerate(out.dims):
            if n % c == 0 and n > 0:
                rows["perrank"].append((here, d, per_rank(d)))

    if op == "iota" and (out.dtype in INT_BITS or out.dtype in FLOAT_PRECISION) and not out.is_tuple:
        d = ins.parsed.get("iota_dimension")
        # An iota counts 0 .. n-1 exactly only while every value is in its type: a float's up to
        # 2^(significand bits) (bf16: 256; past that, rounding repeats values), an int's up to the
        # type's largest value (s8[256] counts 0..127, -128..-1: it wraps). rules/rankpos.egg rpos.
        if isinstance(d, int) and 0 <= d < len(out.dims) and out.dims[d] > 0 and iota_exact(out.dtype, out.dims[d]):
            rows["iotaval"].append((key, d, 0, out.dims[d], here))
    elif op == "constant":
        if out.dtype == "pred" and out.dims == () and (ins.literal or "").strip() == "true":
            rows["truelit"].append((key,))
        b = _arange_start(ins)
        lo, hi = int_range(out.dtype) if out.dtype in INT_BITS else (0, -1)
        if b is not None and lo <= b and b + out.dims[0] - 1 <= hi:  # literals are in range; checked anyway
            rows["iotaval"].append((key, 0, b, out.dims[0], here))
    elif op == "convert" and opnd and opnd[0].dtype in INT_BITS:
        if out.dtype in INT_BITS:
            rows["numconv"].append((key, *_int_range(out.dtype), here))
        elif out.dtype in FLOAT_PRECISION:
            p = 1 << FLOAT_PRECISION[out.dtype]
            rows["numconv"].append((key, -p, p, here))
    elif op == "reshape" and opnd and not out.is_tuple:
        # A reshape that only inserts or removes size-1 dims carries each other dim to the
        # result in order (XLA:CPU's compiled text bitcasts iota[n, 1] to [n]): rules/rankpos.egg.
        src = opnd[0].dims
        si, so = [i for i, n in enumerate(src) if n != 1], [j for j, n in enumerate(out.dims) if n != 1]
        if [src[i] for i in si] == [out.dims[j] for j in so]:
            for i, j in zip(si, so, strict=True):
                rows["unitmove"].append((key, i, j, here))
    elif op == "and" and out.dtype == "pred":
        rows["andop"].append((key,))
    elif op == "reduce" and out.dtype == "pred" and ins.parsed.get("reducer") == "and":
        rows["andreduce"].append((key,))
    elif op in ("maximum", "minimum") and len(opnd) == 2 and opnd[0].dims == opnd[1].dims:
        rows["extop"].append((key, "max" if op == "maximum" else "min"))  # rules/algebra.egg
    elif op == "compare" and opnd and opnd[0].dtype in FLOAT_PRECISION and isinstance(ins.parsed.get("direction"), str):
        rows["fcmpop"].append((key, ins.parsed["direction"]))
    elif op in ("multiply", "add", "subtract") and out.dtype in FLOAT_PRECISION:
        rows["farith"].append((key, op, 1 << FLOAT_PRECISION[out.dtype]))
    elif op == "shift-left" and out.dtype in INT_BITS:
        rows["intshl"].append((key, *_int_range(out.dtype)))
    elif op == "gather" and side == "distributed" and len(opnd) == 2:
        src, idx = opnd[0].dims, opnd[1].dims
        p = ins.parsed
        collapsed = list(p.get("collapsed_slice_dims", []))
        if len(idx) != 1 or p.get("index_vector_dim") != 1 or len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
            return
        d = collapsed[0]
        w = idx[0]
        if not 0 <= d < len(src) or src[d] != c * w or list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
            return
        # Rows kept in place: the gathered (batch) dim is output dim d, the others offset dims.
        if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or tuple(out.dims) != tuple(w if i == d else n for i, n in enumerate(src)):
            return
        if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
            return
        rows["gatherrows"].append((key, d, w, _shape_text(opnd[1].dtype, tuple(idx))))


def _unit_reshape_broadcast(sig: Sig) -> str | None:
    """The key of the broadcast equal to reshape ``sig`` when the reshape only inserts unit
    dims: the operand's dims keep their order, matched to the first result dim of their extent
    after the previous one with only unit dims skipped."""
    (dtype, src), (_, out) = sig.ins[0], sig.out
    if len(out) <= len(src):
        return None
    dims: list[int] = []
    j = 0
    for n in src:
        while j < len(out) and out[j] != n:
            if out[j] != 1:
                return None
            j += 1
        if j == len(out):
            return None
        dims.append(j)
        j += 1
    if any(out[x] != 1 for x in range(j, len(out))):
        return None
    return Sig("broadcast", (("dimensions", "[" + ",".join(map(str, dims)) + "]"),), ((dtype, src),), sig.out).key()


def _group_factors(distributed: Module, c: int) -> set[int]:
    """Group factors K = c/n of the index_selects of n elements in the distributed graph: the
    rank-group relation's tables (GroupTables) are written only for these."""
    comp = distributed.entry
    out = set()
    for ins in comp.instructions:
        if ins.opcode == "scatter":
            # Their backward (index_add of one element, rules/scatter.egg) may sit in a segment
            # of its own, without the index_select.
            out |= scatter_group_factors(ins, [x.shape for x in (comp.get(o) for o in ins.operands) if x is not None], c)
        if ins.opcode != "gather" or len(ins.operands) != 2:
            continue
        src, idx = (comp.get(o) for o in ins.operands)
        if src is None or idx is None:
            continue
        d = _index_select_dim(ins, src.shape.dims, idx.shape.dims)
        if d is not None and src.shape.dims[d] and c % src.shape.dims[d] == 0:
            out.add(c // src.shape.dims[d])
    return out


def _int_range(dtype: str) -> tuple[int, int]:
    """[lo, hi] within the int type's values (capped to ±2^62 so that egglog's i64 bounds
    arithmetic has room; a narrower range only loses proofs)."""
    if dtype[0] == "u":
        return 0, _int_top(dtype)
    return -_int_top(dtype) - 1 if INT_BITS[dtype] < 64 else -(1 << 62), _int_top(dtype)


def _int_top(dtype: str) -> int:
    """The largest value of an int type (capped: egglog's i64)."""
    bits = INT_BITS[dtype] - (1 if dtype[0] == "s" else 0)
    return (1 << min(bits, 62)) - 1


def _index_select_dim(ins: Instruction, src: tuple[int, ...], idx: tuple[int, ...]) -> int | None:
    """d when gather ``ins`` is index_select along d with one index: out = x[i] along d, kept as
    a unit dim at d (indices of one element, each a scalar start along d; whole slices of every
    other dim, which keep their places)."""
    p = ins.parsed
    if len(idx) != 1 or idx[0] != 1 or p.get("index_vector_dim") != 1:
        return None
    collapsed = list(p.get("collapsed_slice_dims", []))
    if len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
        return None
    d = collapsed[0]
    if not 0 <= d < len(src):
        return None
    if list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
        return None
    if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or ins.shape.dims != tuple(1 if i == d else n for i, n in enumerate(src)):
        return None
    if any(k in p for k in ("operand_batching_dims", "start_indices_batching_dims")) and (p.get("operand_batching_dims") or p.get("start_indices_batching_dims")):
        return None
    return d


def _repeat_broadcast(key: str, ins: Instruction, src: tuple[int, ...]) -> list[tuple[object, ...]]:
    """repeatbc rows (key, d, R, N): the broadcast keeps every operand dim in place except that
    it inserts a new dim of extent R right after d (repeat_interleave's first step); N = the
    extent of d and the new dim merged."""
    dims = list(ins.parsed.get("dimensions", []))
    out = ins.shape.dims
    rows: list[tuple[object, ...]] = []
    if len(out) != len(src) + 1:
        return rows
    for d in range(len(src)):
        if dims == [*range(d + 1), *range(d + 2, len(src) + 1)] and out == (*src[: d + 1], out[d + 1], *src[d + 1 :]):
            rows.append((key, d, out[d + 1], src[d] * out[d + 1]))
    return rows


def _mask_tables(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    """maskfor(kbc, kp): broadcast kbc spreads a per-index mask over the rows gather kp makes."""
    dist_gathers = {n.sig.key(): n for n in g.nodes if n.side == "distributed" and n.sig is not None and n.ins.opcode == "gather"}
    bcasts = [n for n in g.nodes if n.side == "distributed" and n.sig is not None and n.ins.opcode == "broadcast" and g.nodes[n.operands[0]].ins.shape.dtype == "pred"]
    for _, kp, _w in rows["gathershard"]:
        gather = dist_gathers.get(str(kp))
        if gather is None:
            continue
        offset = list(gather.ins.parsed.get("offset_dims", []))
        batch = [d for d in range(gather.ins.shape.rank) if d not in offset]
        for n in bcasts:
            if n.ins.shape.dims == gather.ins.shape.dims and list(n.ins.parsed.get("dimensions", [])) == batch:
                rows["maskfor"].append((n.sig.key(), kp))  # type: ignore[union-attr]


def _unit_row_mask_tables(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
    """maskforr(kbc, kr, kp) (rules/rankpos.egg): gather kp keeps each row as a unit dim
    ([N, 1, h]); reshape kr drops that unit dim ([N, h], the same elements in the same order);
    broadcast kbc spreads a per-index mask ([N]) over those rows (dims={0})."""
    nodes = [n for n in g.nodes if n.side == "distributed" and n.sig is not None]
    gathers = {n.sig.key(): n for n in nodes if n.ins.opcode == "gather"}  # type: ignore[union-attr]
    for _, kp, _w in rows["gathershard"]:
        gather = gathers.get(str(kp))
        if gather is None or gather.ins.shape.rank != 3 or gather.ins.shape.dims[1] != 1 or list(gather.ins.parsed.get("collapsed_slice_dims", [])):
            continue
        n_ids, _, h = gather.ins.shape.dims
        for r in nodes:
            if r.ins.opcode == "reshape" and r.ins.shape.dims == (n_ids, h) and g.nodes[r.operands[0]].ins.shape.dims == (n_ids, 1, h):
                for b in nodes:
                    if (b.ins.opcode == "broadcast" and b.ins.shape.dims == (n_ids, h) and g.nodes[b.operands[0]].ins.shape.dims == (n_ids,)
                            and g.nodes[b.operands[0]].ins.shape.dtype == "pred" and list(b.ins.parsed.get("dimensions", [])) == [0]):
                        rows["maskforr"].append((b.sig.key(), r.sig.key(), kp))  # type: ignore[union-attr]


def _unflat_mask_tables(rows: dict[str, list[tuple[object, ...]]], g: Graphs) -> None:
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


# ---- Variadic (value, index) reduces with an argmax/argmin comparator (rules/argreduce.egg).

ARG_DIRECTIONS = {"GE": "max", "GT": "max", "LE": "min", "LT": "min"}


def arg_reducer(module: Module, ins: Instruction) -> str | None:
    """"max" or "min" when ``ins`` is a reduce of (values, indices) whose to_apply is the
    argmax/argmin combine torch-xla emits (torch.argmax, torch.max(dim), argmin):

        value = select(compare(lv, rv, D), lv, rv)
        index = select(compare(lv, rv, EQ), minimum(li, ri), select(compare(lv, rv, D), li, ri))

    with D = GE or GT (max) and LE or LT (min), compares without a comparison type (so -0.0
    equals 0.0 and no total order applies), parameters (lv, li, rv, ri) = 0..3, scalar values of
    one type and indices of one int type. On NaN-free values this combine is associative and
    commutative: it yields the extreme and the lowest index holding it, whatever the order XLA
    reduces in. Anything else is None (the reduce stays unsupported)."""
    if ins.opcode != "reduce" or len(ins.operands) != 4 or not ins.shape.is_tuple or len(ins.shape.tuple_shapes) != 2:
        return None
    callee = ins.parsed.get("to_apply")
    comp = module.computations.get(callee) if isinstance(callee, str) else None
    if comp is None:
        return None
    by = {i.name: i for i in comp.instructions}
    params = {i.parameter_number: i for i in comp.instructions if i.opcode == "parameter"}
    if sorted(params) != [0, 1, 2, 3] or any(p.shape.dims for p in params.values()):
        return None
    lv, li, rv, ri = (params[n].shape.dtype for n in range(4))
    if lv != rv or li != ri or li not in INT_BITS or not (lv in FLOAT_MAX or lv in INT_BITS):
        return None

    def expr(name: str, depth: int = 0) -> object:
        i = by.get(name)
        if i is None or depth > 6:
            return None
        if i.opcode == "parameter":
            return i.parameter_number
        extra = {k for k in i.attrs if k not in ("metadata", "direction")}
        if extra:
            return None
        head = f"compare.{i.parsed.get('direction', i.attrs.get('direction'))}" if i.opcode == "compare" else i.opcode
        return (head, *(expr(o, depth + 1) for o in i.operands))

    root = comp.root
    if root.opcode != "tuple" or len(root.operands) != 2:
        return None
    value, index = (expr(o) for o in root.operands)
    for d, op in ARG_DIRECTIONS.items():
        cmp = (f"compare.{d}", 0, 2)
        if value != ("select", cmp, 0, 2):
            continue
        keep = ("select", cmp, 1, 3)
        ties = [("select", (eq, a, b), (mn, x, y), keep) for eq in ("compare.EQ",) for a, b in ((0, 2), (2, 0)) for mn in ("minimum",) for x, y in ((1, 3), (3, 1))]
        if index in ties:
            return op
    return None


def _arg_tables(rows: dict[str, list[tuple[object, ...]]], node: Node, sig: Sig, opnd: list[Shape], module: Module) -> None:
    """Tables of rules/argreduce.egg, for both graphs: argred(k, d, op, n) a variadic reduce of
    (values, indices) along the single dim d (extent n) with the arg combine of op; iotadim(k, d)
    iotas counting along d; gteidx(k, i, t) get-tuple-element i of type t; intwidento(k, t)
    int->int converts to t that keep every value; redone(k, d, op) a plain reduce along d alone;
    cmpeq(k) an == compare without comparison type; affmove(k) a reshape/broadcast/copy of one
    element to one element (keeps an exact value); unitdim(k, e) a reshape inserting one unit
    dim at e."""
    ins = node.ins
    key = sig.key()
    op = ins.opcode
    if op == "reduce" and len(opnd) == 4:
        a = arg_reducer(module, ins)
        dims = list(ins.parsed.get("dimensions", []))
        if a is not None and len(dims) == 1 and opnd[0].dims == opnd[1].dims and 0 <= dims[0] < len(opnd[0].dims) and opnd[2].dims == opnd[3].dims == ():
            rows["argred"].append((key, dims[0], a, opnd[0].dims[dims[0]]))
    elif op == "reduce" and len(opnd) == 2:
        dims = list(ins.parsed.get("dimensions", []))
        reducer = ins.parsed.get("reducer")
        if len(dims) == 1 and reducer in ("max", "min"):
            rows["redone"].append((key, dims[0], reducer))
    elif op == "iota" and ins.shape.dtype in INT_BITS:
        d = ins.parsed.get("iota_dimension")
        # The index table counts 0 .. n-1 only while n - 1 fits its type (a u8 iota of 512
        # wraps at 256: the "lowest index" would be taken modulo 256).
        if isinstance(d, int) and 0 <= d < ins.shape.rank and iota_exact(ins.shape.dtype, ins.shape.dims[d]):
            rows["iotadim"].append((key, d))
    elif op == "get-tuple-element" and ins.tuple_index is not None and not ins.shape.is_tuple:
        rows["gteidx"].append((key, ins.tuple_index, ins.shape.dtype))
    elif op == "convert" and opnd and _widens(opnd[0].dtype, ins.shape.dtype):
        rows["intwidento"].append((key, ins.shape.dtype))
    elif op == "compare" and len(opnd) == 2 and ins.parsed.get("direction", ins.attrs.get("direction")) == "EQ" and "type" not in ins.attrs:
        rows["cmpeq"].append((key,))
    if op in ("reshape", "broadcast", "copy") and opnd and opnd[0].numel == 1 and ins.shape.numel == 1 and opnd[0].dtype == ins.shape.dtype:
        rows["affmove"].append((key,))
    if op == "reshape" and opnd:
        src, out = opnd[0].dims, ins.shape.dims
        for e in range(len(src) + 1):
            if out == (*src[:e], 1, *src[e:]):
                rows["unitdim"].append((key, e))


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
