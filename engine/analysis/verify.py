"""Check a baseline/distributed pair: seed input relations, saturate, decide, localize, trace."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..hlo.normalize import normalize
from ..hlo.shapecheck import check_module
from ..ir import Instruction, Module
from ..relations import RelationSpec
from ..sourcemap import SourceMap
from .egg import RunStats, Session
from .facts import Facts, expected_text, read_facts
from .graph import Graphs, build
from .inputs import check_inputs, outputs, param
from .layouts import LayoutSolver
from .localize import localize, trace

VERIFIED, DIVERGED, UNSUPPORTED, INCONCLUSIVE = "verified", "diverged", "unsupported", "inconclusive"
# Opcodes whose rules cover only some uses; an unrelated one is not evidence of a bug.
PARTIAL_RULES = frozenset({"all-to-all", "collective-permute", "reverse", "scatter", "custom-call"})


@dataclass
class Budget:
    max_iterations: int = 400
    seconds: float = 120.0
    layout_rounds: int = 32


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


def verify(spec: RelationSpec, baseline: Module, distributed: Module, sourcemap: SourceMap | None = None, budget: Budget | None = None) -> Result:
    budget = budget or Budget()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    tokens = frozenset(param(distributed, b.distributed, b.key, "distributed", spec.path).name for b in spec.inputs if b.relation.kind == "token" and b.distributed is not None)
    check_module(baseline)
    check_module(distributed)
    base = normalize(baseline)
    dist = normalize(distributed, tokens)
    timings["normalize"] = time.perf_counter() - t
    bound, rank_params = check_inputs(spec, base, dist)
    bouts, douts = outputs(base), outputs(dist)
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
        facts = read_facts(session, g, solver)
    finally:
        session.close()
    res = _decide(spec, g, facts, bouts, douts, sm, stats.saturated)
    res.bijections = facts.bijections
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


def _decide(spec: RelationSpec, g: Graphs, facts: Facts, bouts: list[Instruction], douts: list[Instruction], sm: SourceMap, saturated: bool) -> Result:
    outputs = []
    all_ok = True
    for b in spec.outputs:
        assert isinstance(b.baseline, int) and isinstance(b.distributed, int)
        bn = g.node("baseline", bouts[b.baseline].name)
        dn = g.node("distributed", douts[b.distributed].name)
        want = expected_text(b)
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
            "trace": trace(g, facts, dn, sm),
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
    res.divergences = localize(spec, g, facts, outputs, douts, sm)
    res.reason = f"{sum(1 for o in outputs if not o['ok'])} output(s) lack their expected relation"
    if res.divergences and all(d["opcode"] in PARTIAL_RULES for d in res.divergences):
        # Our rules for these opcodes are incomplete: failing to relate them proves no bug.
        ops = sorted({d["opcode"] for d in res.divergences})
        res.verdict = INCONCLUSIVE
        res.reason = f"the rules cannot relate {', '.join(ops)} here (incomplete rules for this opcode, not a proven divergence)"
    return res
