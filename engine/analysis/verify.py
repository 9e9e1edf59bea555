"""Check a baseline/distributed pair: seed input relations, saturate, decide, localize, trace."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, phase
from ..gcpause import gc_paused
from ..hlo.fold import Fold
from ..hlo.literals import ASSUMED_EQUAL
from ..hlo.normalize import normalize
from ..hlo.parser import literal_is_elided
from ..hlo.shapecheck import check_module
from ..ir import Instruction, Module
from ..relations import Binding, RelationSpec
from ..sourcemap import SourceMap
from . import folded, partition
from .egg import ITERATIONS, LAYOUT_ROUNDS, NODES, SECONDS, RunStats, Session, fresh_session, heads
from .facts import Fact, Facts, carried_seeds, expected_text, public_bijections, read_facts
from .graph import ELIDED_HINT, Graphs, Node, build, elided_constants
from .inputs import check_inputs, outputs, param, range_seeds
from .laws.layout import LayoutSolver
from .localize import localize, trace
from .partition import Segment, plan

VERIFIED, DIVERGED, UNSUPPORTED, INCONCLUSIVE = "verified", "diverged", "unsupported", "inconclusive"
# The rules stopped (a frontier) but the numeric witness found every output equal: no proof, no bug.
UNPROVEN = "unproven"
ERROR = "error"  # the tool crashed (errors.InternalError): never a verdict about the program
# Opcodes whose rules cover only some uses; an unrelated one is not evidence of a bug.
PARTIAL_RULES = frozenset({"all-to-all", "collective-permute", "reverse", "scatter", "custom-call"})


@dataclass
class Budget:
    max_iterations: int = 400  # per e-graph (per segment when partitioned)
    seconds: float = 120.0  # per e-graph
    # Per e-graph: rows in all its tables (e-nodes plus relation tuples, as egglog's print-size
    # counts them); a graph that explodes stops here instead of taking the runner's memory.
    # Measured resident memory per row: 0.3-0.45 KB with our rules (a 7776-wide transpose fan-out
    # layer, 44k-160k rows), 0.7-0.95 KB for an associativity/commutativity blow-up (350k-916k
    # rows). So 2M rows is 0.6-2 GB per e-graph (one iteration may overshoot, see Session.run),
    # at most ~4 GB for the default two workers. Real models use 8-20 rows per instruction
    # (tests/pairs): 2M rows is ~100k instructions in one e-graph, far above any layer.
    max_nodes: int = 2_000_000
    layout_rounds: int = 32
    partition: bool = True  # cut at layer boundaries when both graphs name their layers
    layer_pattern: str | None = None  # regex with one group: the layer number in op_name
    workers: int = 2  # e-graphs solved at once (one per thread) for independent segments
    progress: bool = False  # per-layer progress on stderr (only when it is a terminal)
    fold: bool = True  # fold repeated layers in the text before parsing (hlo.fold; check_files)


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
    error: dict[str, str] | None = None  # {"phase", "where", "message"} when verdict == ERROR
    # The numeric witness (engine.witness, run by check.check_files): None when it did not run.
    witness: dict[str, Any] | None = None
    # What the verdict assumes beyond the rules (relations.ASSUMPTIONS, set by check.check_files):
    # [{"name", "text", "constants": [...]}]; empty when it assumes nothing.
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    # The graph and proven facts of the run (not serialized): the witness seeds a segment's
    # inputs with the relations proven for the values it reads.
    context: Any = field(default=None, repr=False, compare=False)

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
            "error": self.error,
            "witness": self.witness,
            "assumptions": self.assumptions,
        }


@gc_paused()
def verify(spec: RelationSpec, baseline: Module, distributed: Module, sourcemap: SourceMap | None = None, budget: Budget | None = None, fold: Fold | None = None) -> Result:
    """Verify the pair. With ``fold`` (the modules were parsed from ``fold``'s texts), folded
    layers are related by proofs of their own blocks; a pair that does not cut where the fold
    cut raises folded.FoldMismatch."""
    budget = budget or Budget()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    tokens = frozenset(param(distributed, b.distributed, b.key, "distributed", spec.path).name for b in spec.inputs if b.relation.kind == "token" and b.distributed is not None)
    with phase("normalize", baseline.path) as p:
        check_module(baseline)
        p.at(distributed.path)
        check_module(distributed)
        p.at(baseline.path)
        base = normalize(baseline)
        p.at(distributed.path)
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

    sm = sourcemap or SourceMap()
    t = time.perf_counter()
    fixed = {side: fold.placeholders(side) for side in ("baseline", "distributed")} if fold else None
    with phase("partition", f"{baseline.path} / {distributed.path}", keep=(folded.FoldMismatch,)):
        segments = plan(base, dist, lambda i: i.metadata.op_name, sm.op_name, budget.layer_pattern, fixed) if budget.partition or fold else None
    if fold and not segments:
        raise folded.FoldMismatch("the folded pair does not cut into layers")
    timings["partition"] = time.perf_counter() - t
    t = time.perf_counter()
    placeholders = frozenset((side, n) for side in ("baseline", "distributed") for n in (fixed or {}).get(side, {}))
    with phase("build", f"{baseline.path} / {distributed.path}"):
        g = build(spec, base, dist, rank_params, with_rows=not segments, folded=placeholders)
    timings["build"] = time.perf_counter() - t
    if g.unsupported:
        u = g.unsupported[0]
        res = Result(UNSUPPORTED, reason=f"{u.side} %{u.instruction} ({u.opcode}): {u.reason}", timings=timings)
        res.unsupported = [vars(x) for x in g.unsupported]
        return res

    t = time.perf_counter()
    solver = LayoutSolver(spec.c)
    with phase("saturate", "the whole pair (one e-graph)", keep=(folded.FoldMismatch,)) as p:
        if segments:
            facts, stats, seg_stats = _solve_segments(spec, g, base, dist, segments, bound, rank_params, solver, budget, fold, tokens, p.at)
        else:
            facts, stats = _solve(g, _input_seeds(g, bound), solver, budget)
            seg_stats = {"segments": 1}
    timings["saturate"] = time.perf_counter() - t
    t = time.perf_counter()
    with phase("localize", distributed.path):
        clock: dict[str, float] = {}
        res = _decide(spec, g, facts, bouts, douts, sm, stats.saturated, clock)
        res.bijections = public_bijections(facts.bijections)
    res.context = (g, facts)
    if fixed and res.verdict == DIVERGED:
        _folded_frontier(res, fixed["distributed"])
    if res.verdict != VERIFIED:
        _unknown_constants(res, g)
    if res.verdict == INCONCLUSIVE and not stats.saturated:
        res.reason += _exhausted_text(budget, seg_stats.get("segment_report"), stats)
    res.stats = {**seg_stats, "iterations": stats.iterations, "saturated": stats.saturated, "exhausted": stats.exhausted, "nodes": stats.nodes, "baseline_instructions": len(base.entry.instructions), "distributed_instructions": len(dist.entry.instructions)}
    # The relation trace of the outputs (every pair, verified too) apart from localization
    # proper (the frontier and its causes: only a pair that is not verified).
    timings["localize"] = clock.get("localize", 0.0)
    timings["trace"] = time.perf_counter() - t - timings["localize"]
    res.timings = timings
    return res


def _folded_frontier(res: Result, placeholders: dict[str, int]) -> None:
    """A folded run whose divergence lies on a folded layer's output is not an answer. Why: in
    the folded pair that output is a placeholder whose operands are the block's inputs, so the
    localizer sees it as the first unrelated value although the block's own instructions (hidden
    from this graph) may go wrong earlier: a stale microbatch read inside a repeated layer was
    reported at the layer's last add, with no source line, instead of at the multiply that mixes
    two microbatches. The verdict drops to inconclusive so the caller (check.check_files) runs
    the pair unfolded, which localizes inside the layer; the folded facts stay proven."""
    hidden = [d["instruction"] for d in res.divergences if d["instruction"].lstrip("%") in placeholders]
    if hidden:
        res.verdict = INCONCLUSIVE
        res.reason += f"; {hidden[0]} is the output of folded layer {partition.label_text(placeholders[hidden[0].lstrip('%')])}, whose instructions this run does not see"


def _unknown_constants(res: Result, g: Graphs) -> None:
    """An output the rules could not relate that is computed from an elided constant
    (``{...}``, an unknown value) is unsupported, not diverged: the text lacks the values a
    proof, or a witness, would need (XLA's parser even fills such a constant with made-up
    values). The unsupported entries name each constant and how to dump it in full."""
    roots = [(side, str(o[side]).lstrip("%")) for o in res.outputs if not o["ok"] for side in ("baseline", "distributed")]
    elided = elided_constants(g, roots)
    if not elided:
        return
    u = elided[0]
    res.verdict = UNSUPPORTED
    res.reason = f"{u.side} %{u.instruction} ({u.opcode}): {u.reason}. {ELIDED_HINT}"
    res.unsupported = [vars(x) for x in elided]
    res.divergences = []


# How a reason names the budget that ran out (RunStats.exhausted), with its value.
_BUDGET_TEXT = {
    ITERATIONS: "iteration budget (max_iterations={max_iterations})",
    SECONDS: "time budget (seconds={seconds:g})",
    NODES: "node budget (max_nodes={max_nodes})",
    LAYOUT_ROUNDS: "layout-round budget (layout_rounds={layout_rounds})",
}


def _exhausted_text(budget: Budget, report: list[dict[str, Any]] | None, stats: RunStats) -> str:
    """The reason's tail naming which budget ran out, and in which layer(s) when partitioned:
    the user raises that budget, or splits that layer."""

    def name(kind: str) -> str:
        return _BUDGET_TEXT.get(kind, "budget").format(**vars(budget))

    if not report:  # one e-graph for the whole pair
        return f" ({name(stats.exhausted)} exhausted)"
    layers: list[str] = []
    by_kind: dict[str, list[str]] = {}
    for r in report:
        if not r.get("saturated", True):
            layers.append(partition.label_text(r["layer"]))  # "backward of 7" for a backward segment
            by_kind.setdefault(r.get("exhausted", ""), []).append(partition.label_text(r["layer"]))
    if len(by_kind) == 1:
        return f" (budget exhausted in layer(s) {', '.join(layers)}: {name(next(iter(by_kind)))})"
    parts = "; ".join(f"{name(kind)} in layer(s) {', '.join(ls)}" for kind, ls in by_kind.items())
    return f" (budget exhausted in layer(s) {', '.join(layers)}: {parts})"


def _input_seeds(g: Graphs, bound: list[tuple[Binding, Instruction | None, Instruction]]) -> list[str]:
    """Facts the relations file states about parameters present in g."""
    seeds = []
    for b, bp, dp in bound:
        if bp is None or ("baseline", bp.name) not in g.by_name or ("distributed", dp.name) not in g.by_name:
            continue
        rank_dims = tuple(dp.shape.dims)
        seeds.extend(_binding_seeds(b, g.by_name[("baseline", bp.name)], g.by_name[("distributed", dp.name)], rank_dims))
    return seeds


def _binding_seeds(b: Binding, bg: int | str, dg: int | str, rank_dims: tuple[int, ...] = ()) -> list[str]:
    """The facts an input binding states, for baseline node bg and distributed node dg."""
    rel, seeds = b.relation, []
    if rel.kind == "duplicate":
        seeds.append(f"(dup (N {bg}) (N {dg}))")
    elif rel.kind == "sharded":
        seeds.append(f'(sharded (N {bg}) (N {dg}) {rel.dim} "{",".join(map(str, rel.blocks))}")')
    elif rel.kind == "partial":
        seeds.append(f'(partial (N {bg}) (N {dg}) "{rel.op}")')
    elif rel.kind == "grouped":
        # rules/kvgroups.egg: rank r holds its group's whole block (o = 0), no tail.
        seeds.append(f"(kvg (N {bg}) (N {dg}) {rel.dim} {rank_dims[rel.dim or 0]} 1 {rel.head_groups} 0)")
    elif rel.kind == "padded" and rel.head_groups > 1:
        # rules/kvgroups.egg: each group zero-padded at its tail and split over its ranks (o = 1).
        seeds.append(f"(kvg (N {bg}) (N {dg}) {rel.dim} {rel.width} 1 {rel.head_groups} 1)")
    elif rel.kind == "padded":
        # rules/padded.egg: zero-padded (z = 1), rank r holds [r·width, r·width + width).
        if len(rel.blocks) > 1:
            # Each block padded on its own (a fused weight): rules/padded.egg padb, spec "n:w,...";
            # one block is the plain layout.
            seeds.append(f'(padb (N {bg}) (N {dg}) {rel.dim} {rel.width} 1 "{rel.padded_spec()}")')
        else:
            seeds.append(f"(pad (N {bg}) (N {dg}) {rel.dim} {rel.width} 1)")
    # A declared range bounds the baseline value; on the pieces only where they hold nothing else.
    seeds.extend(range_seeds(b, bg, dg))
    return seeds


def _solve(g: Graphs, seeds: list[str], solver: LayoutSolver, budget: Budget) -> tuple[Facts, RunStats]:
    """One e-graph: load g's rows and the seeds, saturate, read the facts back."""
    # The input tables with rows: rules reading any other cannot fire and are not loaded.
    present = {t for t, rows in g.rows.items() if rows}.union(*(heads(seed) for seed in seeds))
    with fresh_session(present=present) as session:
        for table, rows in g.rows.items():
            session.load(table, rows)
        for seed in seeds:
            session.command(seed)
        stats = _saturate(session, g, solver, budget)
        return read_facts(session, g, solver), stats


def _solve_segments(spec: RelationSpec, g: Graphs, base: Module, dist: Module, segments: list[Segment], bound: list[tuple[Binding, Instruction | None, Instruction]], rank_params: set[str], solver: LayoutSolver, budget: Budget, fold: Fold | None = None, tokens: frozenset[str] = frozenset(), at: Callable[[str], None] = lambda where: None) -> tuple[Facts, RunStats, dict[str, Any]]:
    """Prove segment pairs stage by stage, carrying proven facts across cuts. Identical segment
    pairs are proven once; the distinct ones of a stage run in parallel, one e-graph per thread.
    Folded layers are proven from their own blocks, once per class and input facts. ``at`` is
    told the layer being worked on (errors.Phase.at), so a crash names it."""
    sides = {"baseline": partition.Side(base), "distributed": partition.Side(dist)}
    keep = {side: frozenset(fold.placeholders(side)) for side in ("baseline", "distributed")} if fold else None
    known = Facts({}, {}, {}, [])
    seen: set[tuple[int, str, frozenset[int]]] = set()
    # fingerprint -> [(canonical text, result)]: the text is compared in full, so two different
    # segments whose fingerprints collide never share a result.
    memo: dict[str, list[tuple[str, tuple[Facts, RunStats]]]] = {}
    # folded blocks: class and canonical seeds, in full -> (block result, layer proven whole)
    block_memo: dict[str, tuple[folded.BlockResult, int]] = {}
    report: list[dict[str, Any]] = [{} for _ in segments]
    total = RunStats(0, True, 0.0)  # exhausted: the first budget that ran out; nodes: the largest e-graph
    proven = reused = 0
    progress = Progress(len(segments), budget.progress)
    levels = partition.stages(segments, sides["baseline"], sides["distributed"])

    def add_run(run: RunStats) -> None:
        nonlocal total, proven
        proven += 1
        total = RunStats(total.iterations + run.iterations, total.saturated and run.saturated, total.seconds + run.seconds, total.exhausted or run.exhausted, max(total.nodes, run.nodes))

    with ThreadPoolExecutor(max_workers=max(1, budget.workers)) as pool:
        for level in levels:
            prepared: list[_Prepared | tuple[folded.FoldedLayer, str]] = []
            jobs: dict[str, Future[tuple[Facts, RunStats]]] = {}
            block_jobs: dict[str, tuple[Future[folded.BlockResult], int]] = {}
            labels: dict[str, int] = {}  # job key -> the first layer that asked for it
            for i in level:
                at(f"layer {segments[i].label}")
                fl = fold.layers.get(segments[i].label) if fold else None
                if fl is not None:
                    _check_folded_segment(segments[i], fl)
                    seeds = folded.seeds(fl, g, bound, known, _binding_seeds, rank_params, tokens)
                    key = f"{fl.cls}\n" + "\n".join(seeds)
                    hit = key in block_memo or key in block_jobs
                    report[i] = {"layer": segments[i].label, "fingerprint": partition.fingerprint(key), "reused": hit, "folded": True, "instructions": len(fl.baseline.closure) + len(fl.distributed.closure)}
                    labels.setdefault(key, segments[i].label)
                    if not hit:
                        block_jobs[key] = (pool.submit(folded.prove, spec, fold, fl, seeds, rank_params, tokens, solver, budget, _solve), fl.label)
                    prepared.append((fl, key))
                    continue
                prep = _prepare(spec, g, segments[i], sides, bound, known, rank_params, tokens, keep)
                prepared.append(prep)
                fp = partition.fingerprint(prep.text)
                bucket = memo.setdefault(fp, [])
                hit = next((r for t, r in bucket if t == prep.text), None)
                report[i] = {"layer": segments[i].label, "fingerprint": fp, "reused": hit is not None or prep.text in jobs, "instructions": len(prep.to_global)}
                labels.setdefault(prep.text, segments[i].label)
                if hit is None and prep.text not in jobs:
                    sg = build(spec, sides["baseline"].sub_module(prep.views[0], "b"), sides["distributed"].sub_module(prep.views[1], "d"), rank_params)
                    jobs[prep.text] = pool.submit(_solve, sg, prep.seeds, solver, budget)
            for text, job in jobs.items():
                at(f"layer {labels[text]}")
                result = job.result()
                memo[partition.fingerprint(text)].append((text, result))
                add_run(result[1])
            for key, (bjob, label) in block_jobs.items():
                at(f"layer {labels[key]} (folded)")
                bres = bjob.result()
                block_memo[key] = (bres, label)
                add_run(bres.stats)
            for i, item in zip(level, prepared, strict=True):
                reused += report[i]["reused"]
                if isinstance(item, tuple):
                    fl, key = item
                    bres, label = block_memo[key]
                    run = bres.stats
                    folded.merge(known, seen, bres, fl, g, label)
                else:
                    result = next(r for t, r in memo[partition.fingerprint(item.text)] if t == item.text)
                    run = result[1]
                    _merge(known, seen, result[0], item.to_global, g)
                report[i]["saturated"] = run.saturated
                if not run.saturated:
                    report[i]["exhausted"] = run.exhausted
                progress.step(segments[i].label, report[i]["reused"])
    progress.done()
    known.bijections.sort(key=lambda b: (str(b["distributed"]), str(b["baseline"])))
    return known, total, {"segments": len(segments), "stages": len(levels), "segments_proven": proven, "segments_reused": reused, "segments_folded": sum(1 for r in report if r.get("folded")), "segment_report": report}


def _check_folded_segment(seg: Segment, fl: folded.FoldedLayer) -> None:
    """A folded layer's segment holds exactly its placeholders (else the cut moved)."""
    if set(seg.baseline) != set(fl.baseline.outputs) or set(seg.distributed) != set(fl.distributed.outputs):
        raise folded.FoldMismatch(f"layer {fl.label}: the segment is not the folded block's placeholders")


@dataclass
class _Prepared:
    views: tuple[partition.View, partition.View]
    to_global: list[int]  # local node id (= position) -> global node id
    text: str  # canonical text: the memo key
    seeds: list[str]


# A value read across a cut about which no proven fact is carried (nothing relates it to the
# other side in this segment, or only facts that are not carried: masks, ranks' shifted ids) is
# computed again inside the segment from its operands, up to PULL_STEPS instructions back and
# at most PULL_MAX instructions a segment. Why: the two sides need not cut at the same point.
# torch-xla materializes a view in the scope of its first consumer, so the distributed
# program's transpose of the all-reduced embedding names layer 0 while the baseline's names the
# embedding; cut there, the baseline's transpose reaches layer 0 as an opaque parameter that no
# carried fact mentions, and the distributed transpose (of the all-reduce, which is a duplicate
# of the baseline's *untransposed* value) has nothing to meet. Recomputing an instruction from
# its (proven) operands is sound: it computes in the segment exactly what it computes in the
# whole program, and the memo key holds it like any other instruction of the segment.
PULL_STEPS = 2
PULL_MAX = 64


def _prepare(spec: RelationSpec, g: Graphs, seg: Segment, sides: dict[str, partition.Side], bound: list[tuple[Binding, Instruction | None, Instruction]], known: Facts, rank_params: set[str], tokens: frozenset[str], keep: dict[str, frozenset[str]] | None = None) -> _Prepared:
    """A segment pair's canonical text and seeds, from the whole-graph signatures; no e-graph
    rows are built unless the memo misses. Local ids follow build()'s order: baseline first.

    The text is the memo key, so it holds every fact the proof reads about what the segment
    reads: each parameter's role (the rank: build() gives it the rank row; a token), the seeds
    of every input binding it reads (relations and integer ranges), and the proven facts
    carried across the cut (rank-affine, ranges, relations), and every instruction computed
    again from across the cut (PULL_STEPS). ``keep``: per side, instructions never computed
    again (placeholders of folded layers, which only their block's proof relates)."""
    names = {"baseline": list(seg.baseline), "distributed": list(seg.distributed)}
    pulled = 0
    for step in range(PULL_STEPS + 1):
        prep, orphans = _prepare_views(g, names, sides, bound, known, rank_params, tokens)
        fresh = {side: sorted(o - (keep or {}).get(side, frozenset())) for side, o in orphans.items()}
        count = sum(map(len, fresh.values()))
        if step == PULL_STEPS or count == 0 or pulled + count > PULL_MAX:
            return prep
        pulled += count
        for side, extra in fresh.items():
            names[side] += extra
    raise AssertionError("unreachable")


def _prepare_views(g: Graphs, names: dict[str, list[str]], sides: dict[str, partition.Side], bound: list[tuple[Binding, Instruction | None, Instruction]], known: Facts, rank_params: set[str], tokens: frozenset[str]) -> tuple[_Prepared, dict[str, set[str]]]:
    """The segment holding ``names``, and per side the boundary values no carried fact mentions."""
    views = (sides["baseline"].view(names["baseline"]), sides["distributed"].view(names["distributed"]))
    partners = _input_partners(views, bound)
    if partners["baseline"] or partners["distributed"]:
        views = (sides["baseline"].view(names["baseline"] + partners["baseline"]), sides["distributed"].view(names["distributed"] + partners["distributed"]))
    to_global: list[int] = []
    pos: dict[tuple[str, str], int] = {}
    lines: list[str] = []
    assumed: dict[str, int] = {}
    for side, view in zip(("baseline", "distributed"), views, strict=True):
        for name in view.names:
            gid = g.by_name[(side, name)]
            n = g.nodes[gid]
            pos[(side, name)] = len(to_global)
            to_global.append(gid)
            if name in view.boundary:
                lines.append(f"param:{n.ins.shape}()")
            else:
                operands = ",".join(str(pos[(side, g.nodes[o].ins.name)]) for o in n.operands)
                role = ""
                if side == "distributed" and n.ins.opcode == "parameter":
                    role = ":rank" if name in rank_params else ":token" if name in tokens else ""
                key = _elided_key(n.ins, pos[(side, name)], assumed) if n.ins.opcode == "constant" and literal_is_elided(n.ins.literal) else _node_key(n)
                lines.append(f"{key}{role}({operands})")
    seeds: list[str] = []
    for b, bp, dp in bound:
        if ("distributed", dp.name) not in pos:
            continue
        if bp is None or ("baseline", bp.name) not in pos:
            # Only the distributed side is read here: its integer range still holds.
            seeds.extend(range_seeds(b, None, pos[("distributed", dp.name)]))
            continue
        seeds.extend(_binding_seeds(b, pos[("baseline", bp.name)], pos[("distributed", dp.name)], tuple(dp.shape.dims)))
    mentioned: set[str] = set()

    def b_local(m: int) -> str | None:
        name = g.nodes[m].ins.name
        at = pos.get(("baseline", name)) if g.nodes[m].side == "baseline" else None
        if at is None:
            return None
        mentioned.add(name)
        return str(at)

    orphans: dict[str, set[str]] = {"baseline": set(), "distributed": set()}
    for name in views[1].boundary:
        carried = carried_seeds(known, g.by_name[("distributed", name)], str(pos[("distributed", name)]), b_local)
        if not carried:
            orphans["distributed"].add(name)
        seeds.extend(carried)
    orphans["baseline"] = views[0].boundary - mentioned
    seeds = sorted(set(seeds))
    text = "\n".join(lines) + "\n--\n" + "\n".join(seeds)
    return _Prepared(views, to_global, text, seeds), orphans


def _input_partners(views: tuple[partition.View, partition.View], bound: list[tuple[Binding, Instruction | None, Instruction]]) -> dict[str, list[str]]:
    """Per side, the bound input parameters a segment lacks although it reads their partner on
    the other side. Why: the two sides need not read an input in the same segment. A pipeline's
    distributed program slices its input into microbatches before the first layer (the slices
    name no layer, so they fall in the prologue), while the baseline's first layer reads the
    input itself. Without the baseline input beside them, the slices' relation to it (block k of
    the input) can be proven nowhere: the prologue lacks the baseline input, and the layer after
    reads the slices across the cut with no fact. A parameter is a leaf: adding it computes
    nothing, it only lets the input binding's seed and the laws relate what each side reads."""
    have = (set(views[0].names), set(views[1].names))
    out: dict[str, list[str]] = {"baseline": [], "distributed": []}
    for _b, bp, dp in bound:
        if bp is None:
            continue
        if dp.name in have[1] and bp.name not in have[0]:
            out["baseline"].append(bp.name)
        elif bp.name in have[0] and dp.name not in have[1]:
            out["distributed"].append(dp.name)
    return out


class Progress:
    """One line per model on a terminal, rewritten as layers finish; silent otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        import sys

        self.total = total
        self.count = 0
        self.out = sys.stderr
        self.enabled = enabled and self.out.isatty()

    def step(self, label: int, reused: bool) -> None:
        self.count += 1
        if self.enabled:
            self.out.write(f"\r  layer {label} ({self.count}/{self.total}) {'reused' if reused else 'proven'}   ")
            self.out.flush()

    def done(self) -> None:
        if self.enabled:
            self.out.write("\r" + " " * 60 + "\r")
            self.out.flush()


def _elided_key(ins: Instruction, at: int, assumed: dict[str, int]) -> str:
    """An elided constant's memo key. Every elided literal prints as ``{...}``, so its text
    says nothing about its values: the key says which of the segment's elided constants are
    one value (namesakes under the elided-constants assumption: one local number per assumed
    name, in order of appearance) and makes every other one unique (its local position). Keyed
    by ``{...}`` alone, a later layer whose constants are not namesakes (or are namesakes
    swapped between layers) reused an earlier layer's proof, which equated its namesakes."""
    name = ins.parsed.get(ASSUMED_EQUAL)
    if name:
        return f"const:{ins.shape}:assumed#{assumed.setdefault(str(name), len(assumed))}"
    return f"const:{ins.shape}:elided@{at}"


def _node_key(n: Node) -> str:
    if n.sig is not None:
        return n.sig.key()
    if n.ins.opcode == "constant":
        return f"const:{n.ins.shape}:{n.ins.literal}"
    return f"param:{n.ins.shape}"


def _merge(known: Facts, seen: set[tuple[int, str, frozenset[int]]], local: Facts, to_global: list[int], g: Graphs) -> None:
    """Add a segment's facts to the whole-graph view, naming nodes by their global ids."""
    cls_map: dict[int, int] = {}
    for cls, members in local.members.items():
        gcls = cls_map[cls] = len(known.members)
        known.members[gcls] = [to_global[m] for m in members]
        for m in known.members[gcls]:
            known.classes.setdefault(m, gcls)
    # A class's baseline members, built once and shared by the keys of all its facts: a set per
    # fact cost O(facts x class size), 2 GB and 9 s for one 3125-wide transpose fan-out layer
    # (72k facts on classes of 521 members), ~20 GB for a 7776-wide one.
    baseline_of: dict[int, frozenset[int]] = {}
    for dg_local, facts in local.by_dist.items():
        dg = to_global[dg_local]
        for f in facts:
            bcls = cls_map.get(f.baseline, -1) if f.baseline >= 0 else -1
            if bcls not in baseline_of:
                baseline_of[bcls] = frozenset(m for m in known.members.get(bcls, []) if g.nodes[m].side == "baseline")
            key = (dg, f.relation, baseline_of[bcls])
            if key in seen:
                continue
            seen.add(key)
            known.by_dist.setdefault(dg, []).append(Fact(bcls, dg, f.relation, f.rule, f.seed))
    for b in local.bijections:
        gb, gd = (to_global[x] for x in b["gids"])  # type: ignore[attr-defined]
        named = dict(b, baseline="%" + g.nodes[gb].ins.name, distributed="%" + g.nodes[gd].ins.name, gids=(gb, gd))
        if named not in known.bijections:
            known.bijections.append(named)


def _saturate(session: Session, g: Graphs, solver: LayoutSolver, budget: Budget) -> RunStats:
    """Run the rules; between runs answer the layout family's requests; repeat until quiet."""
    sigs = {n.sig.key(): n.sig for n in g.nodes if n.sig is not None}
    total = RunStats(0, False, 0.0)
    # Per e-graph: an answer loaded into one e-graph is not in another (segments share solver).
    answered: set[tuple[str, str, str, str]] = set()
    for _ in range(budget.layout_rounds):
        stats = session.run(budget.max_iterations - total.iterations, budget.seconds - total.seconds, budget.max_nodes)
        total = RunStats(total.iterations + stats.iterations, stats.saturated, total.seconds + stats.seconds, stats.exhausted, max(total.nodes, stats.nodes))
        if not stats.saturated:
            return total
        wants = session.rows(["lwant-d", "lwant-b", "lwant-dot", "lwant-pair", "lwant-dot2"])
        answers: dict[str, list[tuple[object, ...]]] = {"lstep-d": [], "lstep-b": [], "ldot": [], "lpair": [], "ldot2": []}
        fresh = False
        for table, side in (("lwant-d", "d"), ("lwant-b", "b")):
            for lkey, kind, k in wants[table]:
                tag = (side, str(lkey), str(kind), str(k))
                if tag in answered:
                    continue
                answered.add(tag)
                fresh = True
                step = solver.step(side, str(lkey), str(kind), sigs[str(k)])
                if step is not None:
                    answers[f"lstep-{side}"].append((lkey, kind, k, *step))
        for lkey, k1, k2, kb, kd in wants["lwant-dot"]:
            tag = ("dot", str(lkey), str(k1), str(k2) + "|" + str(kb), str(kd))
            if tag in answered:
                continue
            answered.add(tag)
            fresh = True
            step = solver.dot_step(str(lkey), str(k1), str(k2), sigs[str(kb)], sigs[str(kd)])
            if step is not None:
                answers["ldot"].append((lkey, k1, k2, kb, kd, *step))
        for lkey, kind, kb, kd in wants["lwant-pair"]:  # rules/layout.egg: a reduce or broadcast under a layout
            tag = ("red", str(lkey), str(kind), str(kb) + "|" + str(kd))
            if tag in answered:
                continue
            answered.add(tag)
            fresh = True
            step = solver.pair_step(str(lkey), str(kind), sigs[str(kb)], sigs[str(kd)])
            if step is not None:
                answers["lpair"].append((lkey, kind, kb, kd, *step))
        for l1, k1, l2, k2, kb, kd in wants["lwant-dot2"]:  # rules/layout.egg: both dot operands laid out
            tag = ("dot2", f"{l1}|{k1}", f"{l2}|{k2}", f"{kb}|{kd}")
            if tag in answered:
                continue
            answered.add(tag)
            fresh = True
            step = solver.dot2_step(str(l1), str(k1), str(l2), str(k2), sigs[str(kb)], sigs[str(kd)])
            if step is not None:
                answers["ldot2"].append((l1, k1, l2, k2, kb, kd, *step))
        if not fresh:
            return total
        for table, rows in answers.items():
            session.load(table, rows)
    return RunStats(total.iterations, False, total.seconds, LAYOUT_ROUNDS, total.nodes)


SHARED_TRACE_OUTPUTS = 16  # more outputs than this: shared trace steps are listed once


def _decide(spec: RelationSpec, g: Graphs, facts: Facts, bouts: list[Instruction], douts: list[Instruction], sm: SourceMap, saturated: bool, clock: dict[str, float] | None = None) -> Result:
    outputs = []
    all_ok = True
    steps: dict[int, list[dict[str, Any]]] = {}  # trace steps per node, shared by the outputs
    # Many outputs (a training step: one per parameter) share most of the graph; listing every
    # shared step once per output made the 405B step's result 1.3 GB. Then each step is listed
    # in the trace of the first output that reads it only ("shared_steps_in_earlier": true).
    listed: set[int] | None = set() if len(spec.outputs) > SHARED_TRACE_OUTPUTS else None
    for b in spec.outputs:
        assert isinstance(b.baseline, int) and isinstance(b.distributed, int)
        bn = g.node("baseline", bouts[b.baseline].name)
        dn = g.node("distributed", douts[b.distributed].name)
        want = expected_text(b)
        have = [f for f in facts.by_dist.get(dn.gid, []) if bn.gid in facts.members.get(f.baseline, ())]
        ok = any(f.relation == want for f in have)
        all_ok &= ok
        outputs.append({
            "index": b.distributed,
            "baseline": "%" + bn.ins.name,
            "distributed": "%" + dn.ins.name,
            "expected": want,
            "found": sorted({f.relation for f in have}),
            "ok": ok,
            "trace": trace(g, facts, dn, sm, steps, listed),
        })
    res = Result(VERIFIED if all_ok else DIVERGED, outputs=outputs)
    res.trace = [{"output": o["index"], "steps": o.pop("trace")} | ({"shared_steps_in_earlier": True} if listed is not None and i else {}) for i, o in enumerate(outputs)]
    if all_ok:
        res.reason = f"all {len(outputs)} output(s) have their expected relation"
        return res
    if not saturated:
        res.verdict = INCONCLUSIVE
        res.reason = "the rewrite budget ran out before saturation; no proof either way"
        return res
    t = time.perf_counter()
    res.divergences = localize(spec, g, facts, outputs, douts, sm)
    if clock is not None:
        clock["localize"] = time.perf_counter() - t
    res.reason = f"{sum(1 for o in outputs if not o['ok'])} output(s) lack their expected relation"
    if res.divergences and all(d["opcode"] in PARTIAL_RULES for d in res.divergences):
        # Our rules for these opcodes are incomplete: failing to relate them proves no bug.
        ops = sorted({d["opcode"] for d in res.divergences})
        res.verdict = INCONCLUSIVE
        res.reason = f"the rules cannot relate {', '.join(ops)} here (incomplete rules for this opcode, not a proven divergence)"
    return res
