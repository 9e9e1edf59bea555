"""Check a baseline/distributed pair: seed input relations, saturate, decide, localize, trace."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..hlo.normalize import normalize
from ..hlo.shapecheck import check_module
from ..ir import Instruction, Module
from ..relations import Binding, RelationSpec
from ..sourcemap import SourceMap, from_metadata
from .egg import RunStats, Session
from .graph import Graphs, Node, build
from .layouts import LayoutSolver
from .ops import COLLECTIVES

VERIFIED, DIVERGED, UNSUPPORTED, INCONCLUSIVE = "verified", "diverged", "unsupported", "inconclusive"
# Opcodes whose rules cover only some uses; an unrelated one is not evidence of a bug.
PARTIAL_RULES = frozenset({"all-to-all", "collective-permute", "reverse", "scatter", "custom-call"})
RANK_FAMILY = ("rank", "shifted", "below0", "abovew", "outside", "clamped")


@dataclass
class Budget:
    max_iterations: int = 400
    seconds: float = 120.0
    layout_rounds: int = 32


@dataclass
class Fact:
    baseline: int
    distributed: int
    relation: str  # "duplicate", "sharded(dim=1)", "partial(add)", ...
    rule: str = ""


@dataclass
class Result:
    verdict: str
    reason: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[dict[str, Any]] = field(default_factory=list)
    unsupported: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    bijections: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "outputs": self.outputs,
            "divergences": self.divergences,
            "unsupported": self.unsupported,
            "trace": self.trace,
            "bijections": self.bijections,
            "stats": self.stats,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }


def _param(module: Module, ref: int | str, key: str, side: str, path: str) -> Instruction:
    params = module.entry.parameters
    for p in params:
        if (isinstance(ref, int) and p.parameter_number == ref) or (isinstance(ref, str) and p.name.lstrip("%") == ref.lstrip("%")):
            return p
    have = ", ".join(f"{p.parameter_number}:{p.name} {p.shape}" for p in params)
    raise InputError(path, f"{key}.{side}", f"no parameter {ref!r} in the {side} entry computation (it has {have})")


def _outputs(module: Module) -> list[Instruction]:
    root = module.entry.root
    if root.opcode == "tuple":
        return [module.entry[o] for o in root.operands]
    return [root]


def check_inputs(spec: RelationSpec, base: Module, dist: Module) -> tuple[list[tuple[Binding, Instruction | None, Instruction]], set[str]]:
    """Resolve and shape-check every input binding; every distributed parameter needs one."""
    c = spec.c
    bound: list[tuple[Binding, Instruction | None, Instruction]] = []
    rank_params: set[str] = set()
    seen: dict[str, str] = {}
    for b in spec.inputs:
        assert b.distributed is not None
        dp = _param(dist, b.distributed, b.key, "distributed", spec.path)
        if dp.name in seen:
            raise InputError(spec.path, b.key, f"distributed parameter {dp.name} is already bound by {seen[dp.name]}")
        seen[dp.name] = b.key
        bp = None
        rel = b.relation
        if rel.kind == "rank":
            if dp.shape.dims != () or dp.shape.dtype not in ("s32", "u32", "s64", "u64"):
                raise InputError(spec.path, b.key, f"a rank input must be an s32[]/u32[] scalar, {dp.name} is {dp.shape}")
            rank_params.add(dp.name)
        elif rel.kind == "token":
            # A token is a leaf with no relation: anything computed from it stays unrelated.
            pass
        else:
            assert b.baseline is not None
            bp = _param(base, b.baseline, b.key, "baseline", spec.path)
            _check_shapes(spec.path, b, bp, dp, c)
        bound.append((b, bp, dp))
    missing = [p for p in dist.entry.parameters if p.name not in seen]
    if missing:
        p = missing[0]
        raise InputError(spec.path, "inputs", f"distributed parameter {p.parameter_number} ({p.name}: {p.shape}) has no relation; say how it relates to the baseline (duplicate, sharded, partial or rank)")
    return bound, rank_params


def _check_shapes(path: str, b: Binding, bp: Instruction, dp: Instruction, c: int) -> None:
    rel = b.relation
    bs, ds = bp.shape, dp.shape
    if bs.dtype != ds.dtype:
        raise InputError(path, b.key, f"element types differ: baseline {bp.name} is {bs}, distributed {dp.name} is {ds}")
    expect = list(bs.dims)
    if rel.kind == "sharded":
        d = rel.dim or 0
        if d >= len(expect):
            raise InputError(path, f"{b.key}.dim", f"dim {d} is out of range for {bp.name}: {bs}")
        if rel.blocks:
            if sum(rel.blocks) != expect[d] or any(x % c for x in rel.blocks):
                raise InputError(path, f"{b.key}.blocks", f"blocks {list(rel.blocks)} must sum to {expect[d]} and each divide by c={c}")
        elif expect[d] % c:
            raise InputError(path, f"{b.key}.dim", f"dim {d} of {bs} does not divide by c={c}")
        expect[d] //= c
    if list(ds.dims) != expect:
        raise InputError(path, b.key, f"distributed {dp.name} is {ds}, but {rel.describe()} of baseline {bp.name} ({bs}) needs {bs.dtype}[{','.join(map(str, expect))}]")


def verify(spec: RelationSpec, baseline: Module, distributed: Module, sourcemap: SourceMap | None = None, budget: Budget | None = None) -> Result:
    budget = budget or Budget()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    tokens = frozenset(_param(distributed, b.distributed, b.key, "distributed", spec.path).name for b in spec.inputs if b.relation.kind == "token" and b.distributed is not None)
    check_module(baseline)
    check_module(distributed)
    base = normalize(baseline)
    dist = normalize(distributed, tokens)
    timings["normalize"] = time.perf_counter() - t
    bound, rank_params = check_inputs(spec, base, dist)
    bouts, douts = _outputs(base), _outputs(dist)
    for b in spec.outputs:
        for side, outs in (("baseline", bouts), ("distributed", douts)):
            idx = b.baseline if side == "baseline" else b.distributed
            assert isinstance(idx, int)
            if idx >= len(outs):
                raise InputError(spec.path, f"{b.key}.{side}", f"the {side} ROOT has {len(outs)} output(s); index {idx} is out of range")

    t = time.perf_counter()
    g = build(spec, base, dist, rank_params)
    timings["build"] = time.perf_counter() - t
    sm = sourcemap or SourceMap()
    if g.unsupported:
        u = g.unsupported[0]
        res = Result(UNSUPPORTED, reason=f"{u.side} %{u.instruction} ({u.opcode}): {u.reason}", timings=timings)
        res.unsupported = [vars(x) for x in g.unsupported]
        return res

    t = time.perf_counter()
    session = Session()
    try:
        for table, rows in g.rows.items():
            session.load(table, rows)
        for b, bp, dp in bound:
            dg = g.by_name[("distributed", dp.name)]
            if bp is None:
                continue
            bg = g.by_name[("baseline", bp.name)]
            rel = b.relation
            if rel.kind == "duplicate":
                session.command(f"(dup (N {bg}) (N {dg}))")
            elif rel.kind == "sharded":
                spec_txt = ",".join(map(str, rel.blocks))
                session.command(f'(sharded (N {bg}) (N {dg}) {rel.dim} "{spec_txt}")')
            elif rel.kind == "partial":
                session.command(f'(partial (N {bg}) (N {dg}) "{rel.op}")')
        timings["load"] = time.perf_counter() - t
        t = time.perf_counter()
        solver = LayoutSolver(spec.c)
        stats = _saturate(session, g, solver, budget)
        timings["saturate"] = time.perf_counter() - t
        t = time.perf_counter()
        facts = _read_facts(session, g, solver)
    finally:
        session.close()
    res = _decide(spec, g, facts, bouts, douts, sm, stats.saturated)
    res.stats = {"iterations": stats.iterations, "saturated": stats.saturated, "baseline_instructions": len(base.entry.instructions), "distributed_instructions": len(dist.entry.instructions)}
    timings["localize"] = time.perf_counter() - t
    res.timings = timings
    return res


def _saturate(session: Session, g: Graphs, solver: LayoutSolver, budget: Budget) -> RunStats:
    """Run the rules; between runs answer the layout family's requests; repeat until quiet."""
    sigs = {n.sig.key(): n.sig for n in g.nodes if n.sig is not None}
    total = RunStats(0, False, 0.0)
    for _ in range(budget.layout_rounds):
        stats = session.run(budget.max_iterations - total.iterations, budget.seconds - total.seconds)
        total = RunStats(total.iterations + stats.iterations, stats.saturated, total.seconds + stats.seconds)
        if not stats.saturated:
            return total
        wants = session.rows(["lwant-d", "lwant-b", "lwant-dot"])
        answers: dict[str, list[tuple[object, ...]]] = {"lstep-d": [], "lstep-b": [], "ldot": []}
        fresh = False
        for table, side in (("lwant-d", "d"), ("lwant-b", "b")):
            for lkey, kind, k in wants[table]:
                tag = (side, str(lkey), str(kind), str(k))
                if tag in solver.answered:
                    continue
                solver.answered.add(tag)
                fresh = True
                step = solver.step(side, str(lkey), str(kind), sigs[str(k)])
                if step is not None:
                    answers[f"lstep-{side}"].append((lkey, kind, k, *step))
        for lkey, k1, k2, kb, kd in wants["lwant-dot"]:
            tag = ("dot", str(lkey), str(k1), str(k2) + "|" + str(kb), str(kd))
            if tag in solver.answered:
                continue
            solver.answered.add(tag)
            fresh = True
            step = solver.dot_step(str(lkey), str(k1), str(k2), sigs[str(kb)], sigs[str(kd)])
            if step is not None:
                answers["ldot"].append((lkey, k1, k2, kb, kd, *step))
        if not fresh:
            return total
        for table, rows in answers.items():
            session.load(table, rows)
    return RunStats(total.iterations, False, total.seconds)


@dataclass
class Facts:
    # distributed gid -> list of (baseline gids, relation text, rule)
    by_dist: dict[int, list[Fact]]
    classes: dict[int, int]  # gid -> e-class number
    members: dict[int, list[int]]  # e-class number -> gids


def _read_facts(session: Session, g: Graphs, solver: LayoutSolver) -> Facts:
    tables = session.rows(["N", "dup", "sharded", "partial", "via", "rank", "layout", "affine", "shifted", "below0", "abovew", "outside", "clamped", "lr"])
    cls_of_value: dict[object, int] = {}
    classes: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for gid, value in tables["N"]:
        cid = cls_of_value.setdefault(value, len(cls_of_value))
        classes[int(gid)] = cid  # type: ignore[arg-type]
        members.setdefault(cid, []).append(int(gid))  # type: ignore[arg-type]
    rules: dict[tuple[int, int], str] = {}
    for x, xp, name in tables["via"]:
        if x in cls_of_value and xp in cls_of_value:
            rules.setdefault((cls_of_value[x], cls_of_value[xp]), str(name))
    by_dist: dict[int, list[Fact]] = {}

    def add(x: object, xp: object, text: str) -> None:
        if x not in cls_of_value or xp not in cls_of_value:
            return
        cx, cxp = cls_of_value[x], cls_of_value[xp]
        rule = rules.get((cx, cxp), "input")
        for dg in members[cxp]:
            if g.nodes[dg].side != "distributed":
                continue
            by_dist.setdefault(dg, []).append(Fact(cx, dg, text, rule))

    for x, xp in tables["dup"]:
        add(x, xp, "duplicate")
    for x, xp, d, s in tables["sharded"]:
        add(x, xp, f"sharded(dim={d}, blocks=[{s}])" if s else f"sharded(dim={d})")
    for x, xp, op in tables["partial"]:
        add(x, xp, f"partial({op})")
    for x, xp, lkey, kind in tables["layout"]:
        if lkey != "id":
            add(x, xp, f"layout({kind}, bijection=[{', '.join(solver.describe(str(lkey)))}])")
    def add_dist_only(xp: object, text: str, rule: str) -> None:
        if xp in cls_of_value:
            for dg in members[cls_of_value[xp]]:
                if g.nodes[dg].side == "distributed":
                    by_dist.setdefault(dg, []).append(Fact(-1, dg, text, rule))

    for (xp,) in tables["rank"]:
        add_dist_only(xp, "rank", "input")
    for xp, a, b in tables["affine"]:
        add_dist_only(xp, f"rank-affine({a}*r{int(b):+d})", "slicing/rank-arithmetic")  # type: ignore[call-overload]
    for z, x, d, _size, n, mask in tables["lr"]:
        blocks = [str(e) for e in range(int(n)) if int(mask) >> e & 1]  # type: ignore[call-overload]
        if x in cls_of_value:
            x_name = "%" + g.nodes[members[cls_of_value[x]][0]].ins.name
            add_dist_only(z, f"sum of blocks {{{','.join(blocks)}}} of {n} along dim {d} of {x_name}", "unroll/loop-reduce")
    for name in ("shifted", "below0", "abovew", "outside", "clamped"):
        for ids, xp, w in tables[name]:
            add(ids, xp, f"{name}(w={w})")
    return Facts(by_dist, classes, members)


def _expected_text(b: Binding) -> str:
    r = b.relation
    if r.kind == "duplicate":
        return "duplicate"
    if r.kind == "sharded":
        return f"sharded(dim={r.dim}, blocks=[{','.join(map(str, r.blocks))}])" if r.blocks else f"sharded(dim={r.dim})"
    return f"partial({r.op})"


def _decide(spec: RelationSpec, g: Graphs, facts: Facts, bouts: list[Instruction], douts: list[Instruction], sm: SourceMap, saturated: bool) -> Result:
    outputs = []
    all_ok = True
    for b in spec.outputs:
        assert isinstance(b.baseline, int) and isinstance(b.distributed, int)
        bn = g.node("baseline", bouts[b.baseline].name)
        dn = g.node("distributed", douts[b.distributed].name)
        want = _expected_text(b)
        bcls = facts.classes.get(bn.gid)
        have = [f for f in facts.by_dist.get(dn.gid, []) if f.baseline == bcls]
        ok = any(f.relation == want for f in have)
        all_ok &= ok
        outputs.append({
            "index": b.distributed,
            "baseline": "%" + bn.ins.name,
            "distributed": "%" + dn.ins.name,
            "expected": want,
            "found": sorted({f.relation for f in have}),
            "ok": ok,
            "trace": _trace(g, facts, dn, sm),
        })
    res = Result(VERIFIED if all_ok else DIVERGED, outputs=outputs)
    res.trace = [{"output": o["index"], "steps": o.pop("trace")} for o in outputs]
    if all_ok:
        res.reason = f"all {len(outputs)} output(s) have their expected relation"
        return res
    if not saturated:
        res.verdict = INCONCLUSIVE
        res.reason = "the rewrite budget ran out before saturation; no proof either way"
        return res
    res.divergences = _localize(spec, g, facts, outputs, douts, sm)
    res.reason = f"{sum(1 for o in outputs if not o['ok'])} output(s) lack their expected relation"
    if res.divergences and all(d["opcode"] in PARTIAL_RULES for d in res.divergences):
        # Our rules for these opcodes are incomplete: failing to relate them proves no bug.
        ops = sorted({d["opcode"] for d in res.divergences})
        res.verdict = INCONCLUSIVE
        res.reason = f"the rules cannot relate {', '.join(ops)} here (incomplete rules for this opcode, not a proven divergence)"
    return res


def _related(facts: Facts, gid: int) -> bool:
    return bool(facts.by_dist.get(gid))


def _describe(g: Graphs, facts: Facts, gid: int) -> str:
    fs = facts.by_dist.get(gid, [])
    if not fs:
        return "unrelated"
    parts = []
    for f in fs[:3]:
        if f.relation == "rank":
            parts.append("the rank index")
        elif f.baseline < 0:
            parts.append(f.relation)
        else:
            bname = _baseline_name(g, facts, f.baseline)
            parts.append(f"{f.relation} of {bname}")
    return "; ".join(parts)


def _baseline_name(g: Graphs, facts: Facts, cls: int) -> str:
    for gid in facts.members.get(cls, []):
        if g.nodes[gid].side == "baseline":
            return "%" + g.nodes[gid].ins.name
    for gid in facts.members.get(cls, []):
        ins = g.nodes[gid].ins
        if ins.opcode == "constant":
            return f"constant {ins.literal}"
    return "a rank-independent value"


def _group_text(spec: RelationSpec) -> str:
    return "{" + ",".join(map(str, spec.groups[0])) + "}" if len(spec.groups) == 1 else str(spec.groups)


def _localize(spec: RelationSpec, g: Graphs, facts: Facts, outputs: list[dict[str, Any]], douts: list[Instruction], sm: SourceMap) -> list[dict[str, Any]]:
    dist_nodes = [n for n in g.nodes if n.side == "distributed"]
    live = _ancestors(g, [g.node("distributed", douts[o["index"]].name).gid for o in outputs if not o["ok"]])
    out: list[dict[str, Any]] = []
    for n in dist_nodes:
        if n.gid not in live or _related(facts, n.gid) or n.ins.opcode in ("parameter", "tuple"):
            continue
        if all(_related(facts, o) for o in n.operands):
            out.append(_divergence(spec, g, facts, n, sm))
    out = [_blame_layout(spec, g, facts, d, sm) for d in out]
    if not out:
        # Every distributed instruction relates to something, but an output has the wrong
        # relation (e.g. still a partial sum): blame the output instruction itself.
        for o in outputs:
            if o["ok"]:
                continue
            n = g.node("distributed", o["distributed"].lstrip("%"))
            origin = _layout_origin(g, facts, n.gid)
            if origin is not None:
                d = _divergence(spec, g, facts, g.nodes[origin], sm)
                d["cause"] = _layout_cause(g, facts, origin, f"output {o['index']}")
                out.append(d)
                continue
            d = _divergence(spec, g, facts, n, sm)
            found = ", ".join(o["found"]) or "nothing"
            d["cause"] = f"output {o['index']} is {found} but must be {o['expected']} of {o['baseline']}"
            if any(f.startswith("partial") for f in o["found"]):
                d["cause"] += f": a reduction over ranks {_group_text(spec)} is missing before the output"
            out.append(d)
    return out


def _layout_only(facts: Facts, gid: int) -> bool:
    fs = facts.by_dist.get(gid, [])
    return bool(fs) and all(f.relation.startswith("layout(") for f in fs)


def _layout_origin(g: Graphs, facts: Facts, gid: int) -> int | None:
    """The distributed instruction where a non-identity layout entered: its operands relate
    plainly (dup, sharded, partial) but it relates to the baseline only through a bijection."""
    if not _layout_only(facts, gid):
        return None
    seen: set[int] = set()
    while gid not in seen:
        seen.add(gid)
        carried = [o for o in g.nodes[gid].operands if _layout_only(facts, o)]
        if not carried:
            return gid
        gid = carried[0]
    return gid


def _layout_cause(g: Graphs, facts: Facts, origin: int, what: str) -> str:
    n = g.nodes[origin]
    bij = next((f.relation for f in facts.by_dist.get(origin, []) if f.relation.startswith("layout(")), "")
    return (
        f"this {n.ins.opcode} to {n.ins.shape} puts elements in a different order than the baseline: "
        f"it relates only through {bij}, which no later step undoes, so {what} does not match "
        "(an axis is split, merged or transposed differently)"
    )


def _blame_layout(spec: RelationSpec, g: Graphs, facts: Facts, d: dict[str, Any], sm: SourceMap) -> dict[str, Any]:
    """A frontier whose operand carries an unresolved bijection is caused where it entered."""
    n = g.node("distributed", d["instruction"].lstrip("%"))
    if any("partial" in x["relation"] for x in d["operands"]):
        return d
    if n.ins.opcode in ("reshape", "transpose"):
        carried = [o for o in n.operands if _layout_only(facts, o)]
        if carried:
            bij = next(f.relation for f in facts.by_dist[carried[0]] if f.relation.startswith("layout("))
            d["cause"] = (
                f"no reshape/transpose bijection maps this {n.ins.opcode} to the baseline: its operand "
                f"%{g.nodes[carried[0]].ins.name} matches the baseline only through {bij}, and this "
                f"{n.ins.opcode} to {n.ins.shape} regroups axes across that order (e.g. (s·b, h) read as (b, s, h))"
            )
        return d
    for o in n.operands:
        origin = _layout_origin(g, facts, o)
        if origin is not None:
            blamed = _divergence(spec, g, facts, g.nodes[origin], sm)
            blamed["cause"] = _layout_cause(g, facts, origin, f"{d['instruction']} ({d['opcode']})")
            blamed["frontier"] = d["instruction"]
            return blamed
    return d


def _ancestors(g: Graphs, roots: list[int]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(g.nodes[n].operands)
    return seen


def _divergence(spec: RelationSpec, g: Graphs, facts: Facts, n: Node, sm: SourceMap) -> dict[str, Any]:
    src = sm.source(n.ins) if sm else from_metadata(n.ins)
    return {
        "instruction": "%" + n.ins.name,
        "opcode": n.ins.opcode,
        "shape": str(n.ins.shape),
        "source": {"file": src.file, "line": src.line, "function": src.function},
        "op_name": sm.op_name(n.ins),
        "hlo_line": n.ins.loc.line if n.ins.loc else None,
        "cause": _cause(spec, g, facts, n),
        "operands": [{"instruction": "%" + g.nodes[o].ins.name, "relation": _describe(g, facts, o)} for o in n.operands],
    }


def _cause(spec: RelationSpec, g: Graphs, facts: Facts, n: Node) -> str:
    ins = n.ins
    group = _group_text(spec)
    rels = {o: [f.relation for f in facts.by_dist.get(o, [])] for o in n.operands}

    def name(o: int) -> str:
        return "%" + g.nodes[o].ins.name

    if ins.opcode in COLLECTIVES:
        groups = ins.parsed.get("replica_groups")
        if n.sig is not None and "groups=G" not in n.sig.key():
            return f"{ins.opcode} over replica groups {groups} does not match the sharding group {spec.groups}: it reduces or gathers the wrong ranks"
        if ins.opcode == "all-reduce" and ins.parsed.get("reducer") == "add":
            for o, rs in rels.items():
                if "duplicate" in rs:
                    return f"operand {name(o)} is already identical on every rank: this all-reduce(add) over {group} sums {spec.c} copies (redundant all-reduce)"
                if any(r.startswith("sharded") for r in rs):
                    return f"operand {name(o)} is sharded, not a partial sum: all-reduce(add) adds different blocks together (an all-gather was expected)"
        return f"no rule relates this {ins.opcode} to the baseline; operands: " + ", ".join(f"{name(o)} is {_describe(g, facts, o)}" for o in n.operands)
    for o, rs in rels.items():
        for r in rs:
            if r.startswith("partial"):
                op = r[len("partial(") : -1]
                return f"operand {name(o)} is a partial {'sum' if op == 'add' else op} over ranks {group}: a reduction (all-reduce) is missing before this {ins.opcode}"
    for o in n.operands:
        c = _dist_only_constant(g, facts, o)
        if c is not None:
            via = "" if c == o else f" (through {name(o)})"
            return f"constant {name(c)} = {g.nodes[c].ins.literal}{via} has no counterpart in the baseline graph: a constant differs from the baseline"
    described = ", ".join(f"{name(o)} is {_describe(g, facts, o)}" for o in n.operands)
    if any(_rank_dependent(r) for rs in rels.values() for r in rs):
        return f"this {ins.opcode} on rank-dependent values does not select exactly this rank's block (check offsets and bounds); operands: {described}"
    counterpart = _baseline_counterpart(g, facts, n)
    if counterpart is not None:
        return f"the baseline computes {counterpart} from the corresponding operands; this {ins.opcode} computes {ins.shape} with different attributes (e.g. a different dtype, shape, offset or axis order)"
    return f"no baseline instruction matches this {ins.opcode} ({ins.shape}); operands: {described}"


def _rank_dependent(relation: str) -> bool:
    if relation.startswith("rank-affine("):
        return not relation.startswith("rank-affine(0*")
    return relation.startswith(RANK_FAMILY)


def _has_baseline(g: Graphs, facts: Facts, cls: int) -> bool:
    return any(g.nodes[m].side == "baseline" for m in facts.members.get(cls, []))


def _dist_only_constant(g: Graphs, facts: Facts, gid: int) -> int | None:
    """A constant feeding gid whose value the baseline never has, when gid's only partners are
    such rank-independent values."""
    fs = facts.by_dist.get(gid, [])
    if not fs or any(f.baseline < 0 or _has_baseline(g, facts, f.baseline) for f in fs):
        return None
    for a in sorted(_ancestors(g, [gid]), reverse=True):
        n = g.nodes[a]
        if n.ins.opcode == "constant" and not _has_baseline(g, facts, facts.classes.get(a, -1)):
            return a
    return None


def _baseline_counterpart(g: Graphs, facts: Facts, n: Node) -> str | None:
    """A baseline instruction consuming the baseline partners of n's operands, if any."""
    partners: set[int] = set()
    for o in n.operands:
        for f in facts.by_dist.get(o, []):
            partners.update(m for m in facts.members.get(f.baseline, []) if g.nodes[m].side == "baseline")
    for b in g.nodes:
        if b.side == "baseline" and b.operands and any(o in partners for o in b.operands) and b.ins.opcode == n.ins.opcode:
            return f"%{b.ins.name} = {b.ins.shape} {b.ins.opcode}"
    return None


def _trace(g: Graphs, facts: Facts, out: Node, sm: SourceMap) -> list[dict[str, Any]]:
    """The related distributed ancestors of an output, inputs first: fact, rule, instruction pair."""
    order = sorted(_ancestors(g, [out.gid]))
    steps = []
    for gid in order:
        n = g.nodes[gid]
        for f in facts.by_dist.get(gid, [])[:2]:
            steps.append({
                "distributed": "%" + n.ins.name,
                "baseline": _baseline_name(g, facts, f.baseline) if f.baseline >= 0 else None,
                "relation": f.relation,
                "rule": f.rule,
                "source": str(sm.source(n.ins)),
            })
    return steps
