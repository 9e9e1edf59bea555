"""Turn the two normalized entry computations into e-graph rows and shape tables.

Node ids are global: baseline instructions first, then distributed ones, so one e-graph holds
both graphs and every fact can name either side.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..ir import Computation, Instruction, Module, Shape
from ..relations import RelationSpec
from .ops import (
    BINARY_POINTWISE,
    COLLECTIVES,
    COMMUTATIVE,
    KNOWN,
    TERNARY_POINTWISE,
    UNARY_POINTWISE,
)
from .signature import Sig, make_sig
from .tables import GroupTables, Tables

POINTWISE = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE

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


ROW_TABLES = (
    "leafrow", "litrow", "urow", "brow", "trow", "vrow", "nilrow", "consrow", "rankrow", "commutative",
    "mirror", "layoutop", "ew", "scalarbcast", "litint", "zerolit", "intop", "intwiden", "cmpop",
    "orop", "boolconv", "selectop", "gathershard", "maskfor", "dsliceat", "identlit", "falselit",
    "onelit", "fillop", "mulop", "addop", "prednefalse", "dotop", "sliceblock", "intconv",
    "reshapeback", "transposeback", "itof", "ftoi", "fdivop", "floorop", "onelem", "intdiv",
    "litfint", "gatherpick", "repeatbc", "mergenext", "unitbcast", "keepsvals",
)  # fmt: skip


def build(spec: RelationSpec, baseline: Module, distributed: Module, rank_params: set[str], with_rows: bool = True, folded: frozenset[tuple[str, str]] = frozenset()) -> Graphs:
    """Nodes, signatures and unsupported-op checks; with ``with_rows``, also the e-graph rows
    and shape tables (skipped for the whole graph when it is solved segment by segment).
    ``folded`` names the (side, instruction) placeholders of folded layers (hlo.fold): nodes
    without signature or rows, related only by proofs of their own blocks."""
    g = Graphs(spec, baseline, distributed)
    tables = Tables(spec.c)
    g.tables = tables
    groups = GroupTables(tables, _group_factors(distributed, spec.c))
    rows: dict[str, list[tuple[object, ...]]] = {k: [] for k in ROW_TABLES}
    rows["groupsize"] = [(spec.c,)]
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
            if side == "baseline":
                init = None
                if ins.opcode == "reduce" and len(operands) == 2:
                    init_ins = g.nodes[operands[1]].ins
                    init = init_ins.literal if init_ins.opcode == "constant" else None
                tables.baseline(sig, ins, init, block_specs)
                if groups.factors:
                    groups.baseline(sig, ins, [d for _, d in sig.ins], sig.out[1])
            elif ins.opcode == "collective-permute":
                tables.permute(sig, ins, spec.groups)
            elif ins.opcode in COLLECTIVES:
                tables.distributed(sig, ins, bool(groups_ok))
    _mask_tables(rows, g)
    _round_trip_rows(rows, g)
    rows.update({k: sorted(v, key=repr) for k, v in tables.rows.items()})
    for k in ("keepsvals", "itof", "ftoi", "fdivop", "floorop", "onelem", "intdiv", "litfint", "repeatbc", "mergenext", "intconv", "sliceblock", "fillop", "mulop", "addop", "prednefalse", "identlit", "litint", "zerolit", "intop", "intwiden", "cmpop", "orop", "boolconv", "selectop", "scalarbcast", "layoutop", "ew", "commutative"):
        rows[k] = sorted(set(rows[k]), key=repr)
    g.rows = rows
    return g


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
    lkey = _literal_key(ins)
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
        if ins.shape.dtype[0] in "su" and value == int(value):
            rows["litint"].append((lkey, int(value)))
        p = FLOAT_PRECISION.get(ins.shape.dtype)
        if p is not None and abs(value) <= 2.0**p and value == int(value):
            rows["litfint"].append((lkey, int(value)))


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
    if ins.shape.is_tuple and ins.opcode not in ("tuple", "sort"):
        unsupported("tuple-shaped results are only understood for tuple, sort and split all-reduces")
    reducer = ins.parsed.get("reducer")
    if isinstance(reducer, str) and reducer.startswith("body:") and ins.opcode != "reduce":
        unsupported(f"{ins.opcode} with a reducer that is not a plain add/max/min/mul/and/or")
    if ins.opcode == "convert" and ins.operands and ins.shape.dtype in INT_BITS:
        src = module.entry.get(ins.operands[0])
        if src is not None and src.shape.dtype not in INT_BITS and src.shape.dtype != "pred" and not _fits_int(module, src, ins.shape.dtype):
            # Out-of-range float->int converts are implementation-defined: XLA:CPU gives
            # different answers for the same value in differently shaped (vectorized) programs.
            # Exception: values provably in range (see _float_bound), such as torch's
            # floor(float(rank) / k) for a rank-selected index.
            unsupported(f"convert {src.shape.dtype}->{ins.shape.dtype} is implementation-defined for out-of-range values")
    if ins.opcode == "custom-call":
        target = ins.parsed.get("custom_call_target", "")
        if target not in g.spec.custom_calls:
            unsupported(f"custom-call target '{target}' is not declared in the relations file (custom_calls)")
    if ins.opcode == "scatter":
        unsupported("scatter has no rules yet")
    if ins.opcode in COLLECTIVES and side == "baseline":
        unsupported("a collective in the baseline (single-device) graph")
    if ins.opcode in ("replica-id", "partition-id"):
        unsupported(f"{ins.opcode} differs per rank; declare the rank as an s32[] input with relation 'rank' instead")
    if ins.opcode in BINARY_POINTWISE and len(ins.operands) != 2:
        unsupported(f"{ins.opcode} with {len(ins.operands)} operands")


FLOAT_MAX = {"f16": 65504.0, "bf16": 3.38953139e38, "f32": 3.40282347e38, "f64": 1.7976931348623157e308}
# Significand precision: every integer of magnitude <= 2**p is exactly representable.
FLOAT_PRECISION = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


def _fits_int(module: Module, src: Instruction, dtype: str) -> bool:
    """Every value ``src`` (a float) can hold converts to the signed int ``dtype`` in range."""
    bound = _float_bound(module, src, 8)
    return bound is not None and dtype[0] == "s" and bound < 2.0 ** (INT_BITS[dtype] - 1) - 1


def _float_bound(module: Module, ins: Instruction, depth: int) -> float | None:
    """An upper bound on |value| of float ``ins`` that holds for every input, or None. Only a
    few forms: int->float converts (bounded by the int type, unless the float type overflows),
    finite scalar literals, division by a nonzero literal, floor/ceil (+1), and the value-
    preserving reshape/broadcast/copy. NaN cannot arise in these forms."""
    dtype = ins.shape.dtype
    if dtype not in FLOAT_MAX or depth <= 0:
        return None
    if ins.opcode == "constant":
        v = _scalar_value(ins)
        return abs(v) if v is not None and abs(v) <= FLOAT_MAX[dtype] else None
    src = [module.entry.get(o) for o in ins.operands]
    if any(o is None for o in src) or not src:
        return None
    a = src[0]
    assert a is not None
    if ins.opcode == "convert":
        if a.shape.dtype in INT_BITS:
            bits = INT_BITS[a.shape.dtype]
            bound = 2.0 ** (bits - 1 if a.shape.dtype[0] == "s" else bits)
            return bound if bound <= FLOAT_MAX[dtype] else None
        if a.shape.dtype in FLOAT_MAX:
            inner = _float_bound(module, a, depth - 1)
            return inner * (1 + 2.0**-7) if inner is not None and inner * 2 <= FLOAT_MAX[dtype] else None
        return None
    if ins.opcode in ("reshape", "broadcast", "copy"):
        return _float_bound(module, a, depth - 1)
    if ins.opcode in ("floor", "ceil"):
        inner = _float_bound(module, a, depth - 1)
        return inner + 1 if inner is not None else None
    if ins.opcode == "divide" and len(src) == 2:
        b = src[1]
        assert b is not None
        num = _float_bound(module, a, depth - 1)
        den = _literal_scalar(module, b, 4)
        if num is None or den is None or abs(den) < 1:
            return None
        return num / abs(den) * (1 + 2.0**-7)
    return None


def _literal_scalar(module: Module, ins: Instruction, depth: int) -> float | None:
    """The one value of a constant scalar, seen through converts and broadcasts of it."""
    if ins.opcode == "constant":
        return _scalar_value(ins)
    if depth <= 0 or ins.opcode not in ("convert", "broadcast", "reshape", "copy") or len(ins.operands) != 1:
        return None
    src = module.entry.get(ins.operands[0])
    if src is None or (ins.opcode == "broadcast" and src.shape.dims != ()):
        return None
    v = _literal_scalar(module, src, depth - 1)
    if v is None or ins.opcode != "convert":
        return v
    # Only converts that keep the value: an int literal into a float type that holds it exactly.
    exact = src.shape.dtype in INT_BITS and ins.shape.dtype in FLOAT_PRECISION and abs(v) <= 2.0 ** FLOAT_PRECISION[ins.shape.dtype]
    return v if exact else None


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


def _scalar_value(ins: Instruction) -> float | None:
    if ins.shape.dims != () or ins.literal is None:
        return None
    text = ins.literal.strip().strip("{}").strip()
    if text in ("true", "false"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


LOWEST_FINITE = {"f32": 3.40282347e38, "bf16": 3.38953139e38, "f16": 65504.0, "f64": 1.7976931348623157e308}


def _identity_of(ins: Instruction, value: float | None) -> list[str]:
    """Reducers this scalar literal is an identity of. The lowest finite value counts for max
    (and the highest for min): torch lowers amax with it, and it is the identity on finite
    inputs."""
    if value is None or ins.shape.dims != ():
        return []
    out = []
    if value == 0:
        out.append("add")
    if value == 1:
        out.append("mul")
    lowest = LOWEST_FINITE.get(ins.shape.dtype)
    if value == float("-inf") or (lowest is not None and value <= -lowest * (1 - 1e-7)):
        out.append("max")
    if value == float("inf") or (lowest is not None and value >= lowest * (1 - 1e-7)):
        out.append("min")
    return out


INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


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
    if op in ("add", "subtract", "multiply") and out_t in INT_BITS:
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
        if (list(p.get("collapsed_slice_dims", [])) == [0] and list(p.get("start_index_map", [])) == [0]
                and src and src[0] % c == 0 and sizes == [1, *src[1:]]
                and p.get("index_vector_dim") == len(opnd[1].dims)):
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
