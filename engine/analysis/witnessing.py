"""The numeric witness applied to a verdict (engine.witness executes; this module decides).

- ``diverged``: the witness executes the pair with the frontier instructions and their baseline
  counterparts as extra outputs. An output that differs on some seed (also in f64) confirms the
  verdict (``witness.status = confirmed``, with the output, errors, one element and the seed).
  Every output equal on every seed: the rules stopped, no bug shows — verdict ``unproven``,
  naming where the rules stopped. Frontier entries whose expected relation holds numerically
  are rule gaps; the first that really differs is reported first, as *the* divergence. When
  every frontier entry holds, the difference arises past the gap: the instructions past it are
  probed and the first whose values differ is reported (``_past_gap``). A rule gap is never
  worded as a bug (``as_gap``): the rules could not relate it, and what the witness found.
- A pair above the memory budget (or one XLA:CPU cannot execute) is not executed. Each diverging
  instruction is then cut out alone, its operands parameters seeded with their proven relations
  (from the run's facts), and executed against its baseline counterpart. One that differs keeps
  ``diverged`` with ``witness.status = unconfirmed`` (evidence at that line, but no output was
  compared: a later instruction may still undo the difference, e.g. ``-(b - a)`` for ``a - b``).
  None differs (each holds alone, or none can be run alone): no evidence, so not ``diverged``
  but ``unproven``, naming where the rules stopped and why the pair was not executed.
  (Compiled modules are executed flattened, engine.witness.flat; a worker killed by an XLA
  abort is retried once on the flattened texts.)
- ``inconclusive`` with a frontier (the rules stopped at an opcode whose rules are partial:
  all-to-all, collective-permute, custom-call, ...): probed like ``diverged``; a confirmed
  difference makes it ``diverged`` (evidence in hand), otherwise it stays ``inconclusive``.
- ``unsupported`` (an instruction without rules): the pair is executed as is; a confirmed
  difference makes it ``diverged``, naming the unsupported instruction as where the rules
  stopped; equal outputs, or a pair the witness cannot execute, keep ``unsupported``.
- ``--witness always``: a verified pair is executed too; a difference is a soundness error of
  the tool (verdict ``error``), never a pass.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from ..relations import RelationSpec
from .verify import DIVERGED, ERROR, INCONCLUSIVE, UNPROVEN, UNSUPPORTED, VERIFIED, Result

MODES = ("auto", "always", "never")
_SHARDED = re.compile(r"sharded\(dim=(-?\d+)(?:, blocks=\[([0-9, ]*)\])?\)\Z")
_PARTIAL = re.compile(r"partial\((\w+)\)\Z")
_RANGE = re.compile(r"value-range\[(-?\d+), (-?\d+)\)\Z")


def relations_doc(spec: RelationSpec) -> dict[str, Any]:
    """The relations file as the witness reads it (the YAML's plain data)."""

    def entry(b: Any) -> dict[str, Any]:
        e: dict[str, Any] = {"relation": b.relation.kind}
        if b.baseline is not None:
            e["baseline"] = b.baseline
        if b.distributed is not None:
            e["distributed"] = b.distributed
        if b.relation.kind == "sharded":
            e["dim"] = b.relation.dim
            if b.relation.blocks:
                e["blocks"] = list(b.relation.blocks)
        if b.relation.kind == "partial":
            e["op"] = b.relation.op
        if b.relation.kind == "grouped":
            e["dim"], e["head_groups"] = b.relation.dim, b.relation.head_groups
        if b.relation.kind == "padded" and b.relation.head_groups > 1:
            e["head_groups"] = b.relation.head_groups
        if b.relation.kind == "padded":
            e["dim"], e["width"] = b.relation.dim, b.relation.width
            if b.relation.blocks:
                e["blocks"], e["width"] = list(b.relation.blocks), list(b.relation.widths)
        if b.int_range is not None:
            e["int_range"] = list(b.int_range)
        if b.gathered is not None:
            e["gathered"] = {"dim": b.gathered.dim, "groups": [list(g) for g in b.gathered.groups]}
        if getattr(b, "per_group_data", False):
            e["per_group_data"] = True
        return e

    return {"groups": spec.groups, "inputs": [entry(b) for b in spec.inputs], "outputs": [entry(b) for b in spec.outputs]}


def command(paths: dict[str, str], relations: str, seed: int) -> str:
    """The shell command that reproduces the witness. It ends up in PR comments, so a file under
    the current directory is named relative to it (else relative to its repository's root,
    the folder holding ``.git``): no path of the machine that ran the check."""
    names = [_portable(p) for p in (paths["baseline"], paths["distributed"], relations)]
    return " ".join(["shardproof", "witness", shlex.quote(names[0]), shlex.quote(names[1]), "--relations", shlex.quote(names[2]), "--seed", str(seed)])


def _portable(path: str) -> str:
    if not os.path.isabs(path):
        return path
    p = Path(path)
    try:
        full = p.resolve()
    except OSError:
        return path
    cwd = Path.cwd().resolve()
    if full.is_relative_to(cwd):
        return full.relative_to(cwd).as_posix()
    for root in full.parents:
        if (root / ".git").exists():
            return full.relative_to(root).as_posix()
    return path


def _probed(d: dict[str, Any]) -> dict[str, Any]:
    """The instruction whose values tell whether a divergence is real: itself, or for one blamed
    on the division that made an unreduced average (analysis.localize._blame_average, which
    holds as a partial sum) the frontier instruction that uses it (``d["probe"]``)."""
    probe = d.get("probe")
    return probe if isinstance(probe, dict) else d


def _counterpart(d: dict[str, Any]) -> str | None:
    c = d.get("baseline_counterpart")
    if not c:
        return None
    m = re.match(r"%([\w.\-]+)", c)
    return m.group(1) if m else None


# A collective has no counterpart of its own opcode in the baseline: what it should equal is the
# baseline value its operand stands for (an all-reduce of a partial sum of B is B, an all-gather
# of a shard of B is B).
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _collective_partner(result: Result, d: dict[str, Any]) -> str | None:
    if d.get("opcode") not in _COLLECTIVES or result.context is None:
        return None
    g, facts = result.context
    gid = g.by_name.get(("distributed", d["instruction"].lstrip("%")))
    if gid is None or not g.nodes[gid].operands:
        return None
    for f in facts.by_dist.get(g.nodes[gid].operands[0], []):
        if f.baseline < 0:
            continue
        for m in facts.members.get(f.baseline, []):
            if g.nodes[m].side == "baseline" and g.nodes[m].ins.opcode != "constant":
                return str(g.nodes[m].ins.name)
    return None


def _where(d: dict[str, Any]) -> str:
    src = d.get("source") or {}
    return f"{src['file']}:{src['line']}" if src.get("file") else f"HLO line {d.get('hlo_line')}"


def apply(result: Result, spec: RelationSpec, paths: dict[str, str], texts: dict[str, str], mode: str = "auto", options: Any = None, segment_texts: dict[str, str] | None = None, sourcemap: Any = None) -> Result:
    """Run the witness as ``mode`` asks and set ``result.witness`` (and the verdict it implies).
    ``segment_texts`` (a folded run's texts: the same instructions outside the folded layers,
    a fraction of the size) are tried first when a diverging instruction is cut out alone."""
    if mode == "never" or result.verdict == ERROR:
        return result
    if result.verdict == VERIFIED and mode != "always":
        return result
    from ..witness.pair import MemoryBudgetError, Probe, WitnessOptions
    from ..witness.service import WitnessCrashed, call

    options = options or WitnessOptions()
    # An inconclusive verdict with a frontier: the rules stopped at an opcode whose rules are
    # partial (verify.PARTIAL_RULES: all-to-all, collective-permute, custom-call, ...). The
    # frontier is probed like a divergence's; a confirmed difference makes it `diverged`.
    gap = result.verdict == INCONCLUSIVE and bool(result.divergences)
    if result.verdict == DIVERGED:  # a difference is likely: compile the f64 recheck up front
        options = dataclasses.replace(options, prefetch_recheck=True)
    t0 = time.perf_counter()
    doc = relations_doc(spec)
    probes = []
    if result.verdict == DIVERGED or gap:
        for d in result.divergences:
            name, partner = _probed(d)["instruction"].lstrip("%"), _counterpart(_probed(d)) or _collective_partner(result, _probed(d))
            cands, unknown = probe_relations(result, spec, name, partner)
            if unknown:
                # No relation the value is known to have: comparing under one guessed from
                # the shapes (e.g. a merged (b·heads) dim read as plain sharded) would claim
                # a difference that is only a different element order.
                d["numeric_note"] = f"not checked: relation unknown ({unknown})"
                continue
            probes.append(Probe(name, partner, relations=cands))
    w: dict[str, Any] = {"status": "skipped", "reason": "", "seeds": [], "trials": 0, "seconds": 0.0, "command": command(paths, spec.path, options.seeds[0]), "outputs": []}
    result.witness = w
    try:
        # The memory guard first, here: a pair above the budget (production size, megabytes of
        # text) is then never shipped to the worker only to be refused there.
        ranks = sum(len(g) for g in spec.groups)
        floor = 2 * (_parameter_bytes(texts["baseline"]) + ranks * _parameter_bytes(texts["distributed"]))
        if floor > options.memory_mb * 2**20:
            # (a part of engine.witness's estimate, which counts parameters twice too: when it
            # alone is above the budget the estimate is, so this is the same refusal, earlier)
            raise MemoryBudgetError(floor, options.memory_mb)
        # In a worker process: XLA aborts the process on some texts it cannot compile.
        try:
            report = call("pair.witness", texts["baseline"], texts["distributed"], doc, options, probes)
        except WitnessCrashed:
            if options.flatten != "auto":
                raise
            # Once more on the flattened re-printing of both texts (engine.witness.flat), which
            # has none of the fusions or layouts XLA's CPU emitter aborts on.
            report = call("pair.witness", texts["baseline"], texts["distributed"], doc, dataclasses.replace(options, flatten="always"), probes)
        probes = report.probes
    except MemoryBudgetError as e:
        w["status"] = "skipped"
        w["reason"] = f"not executed: {e}"
        if result.verdict == DIVERGED:
            _unexecuted(result, spec, texts, options, w, f"the whole pair was not executed: {e}", segment_texts)
        w["seconds"] = round(time.perf_counter() - t0, 3)
        return result
    except Exception as e:  # XLA:CPU cannot execute the pair (custom-calls of another backend, ...)
        w["status"] = "error"
        w["reason"] = f"the witness could not execute the pair: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
        if result.verdict == DIVERGED:
            # The diverging instruction alone may still compile (the rest of the text holds
            # what XLA:CPU refuses).
            _unexecuted(result, spec, texts, options, w, w["reason"], segment_texts)
        w["seconds"] = round(time.perf_counter() - t0, 3)
        return result
    w["seeds"] = report.seeds
    w["trials"] = report.trials
    w["seconds"] = round(time.perf_counter() - t0, 3)
    w["outputs"] = [c.to_json(spec.outputs[k].distributed if k < len(spec.outputs) else None) for k, c in enumerate(report.outputs)]
    if report.seed is not None:
        w["command"] = command(paths, spec.path, report.seed)
    if report.rounding:
        w["rounding_seeds"] = report.rounding
    n = report.trials
    if not report.equal:
        bad = next(c for c in report.outputs if not c.allclose)
        where = f" at {list(bad.index)}" + (f" on rank {bad.rank}" if bad.rank is not None else " (sum over ranks)") if bad.index is not None else ""
        w["status"] = "confirmed"
        w["reason"] = (f"output {bad.distributed} ({bad.relation}) differs on seed {report.seed}: max abs err {bad.max_abs_diff:.3g}, max rel err {bad.max_rel_diff:.3g}"
                       + (f"; element{where}: baseline {bad.baseline_value}, distributed {bad.distributed_value}" if where else "") + (f" ({bad.note})" if bad.note else ""))
        if result.verdict == VERIFIED:
            result.verdict = ERROR
            msg = f"SOUNDNESS ERROR: the rules verified this pair but XLA's CPU runtime finds it different — {w['reason']}. Reproduce: {w['command']}"
            result.error = {"phase": "witness", "where": f"{paths['baseline']} / {paths['distributed']}", "message": msg}
            result.reason = msg
            return result
        if result.verdict == DIVERGED:
            _label(result, probes, confirmed=True)
            _past_gap(result, spec, texts, doc, options, sourcemap, {k for k, c in enumerate(report.outputs) if not c.allclose})
            result.reason += f"; confirmed numerically: {w['reason']}"
        elif gap:
            # Evidence in hand (contract: `diverged` needs a witness, and here it is): the
            # outputs differ, whatever the rules could not relate. The frontier says where.
            _label(result, probes, confirmed=True)
            _past_gap(result, spec, texts, doc, options, sourcemap, {k for k, c in enumerate(report.outputs) if not c.allclose})
            result.verdict = DIVERGED
            result.reason = f"{_stop(result)}; confirmed numerically: {w['reason']}"
        elif result.verdict == UNSUPPORTED and result.unsupported:
            # Evidence in hand, as for an inconclusive frontier: the outputs differ, whatever
            # instruction the rules have none for. That instruction is where they stopped.
            # The distributed program's own instruction first: it is the code under review.
            u = next((x for x in result.unsupported if x.get("side") == "distributed"), result.unsupported[0])
            stop = _unsupported_divergence(u, texts, [k for k, c in enumerate(report.outputs) if not c.allclose])
            if u.get("side") == "distributed":
                result.divergences = [stop]  # the bot reads a distributed name in the source map
            result.verdict = DIVERGED
            result.reason = (f"the rules stopped at the unsupported {u.get('side')} instruction {stop['instruction']} ({stop['opcode']}, {_where(stop)}): "
                             f"{u.get('reason')}; confirmed numerically: {w['reason']}")
        elif result.verdict in (UNSUPPORTED, INCONCLUSIVE):
            result.reason += f" (the witness finds the outputs different: {w['reason']})"
        return result
    w["status"] = "equal"
    # "numerically equal" only when no seed showed a difference at all; a difference that
    # vanished in the f64 recheck is said as such.
    equal = f"numerically equal on {n} random inputs at these shapes" if not report.rounding else (
        f"equal up to rounding on {n} random inputs at these shapes (seed(s) {report.rounding} differ as written but agree when recomputed in f64"
        " — f32 in f64, bf16/f16 sums within the baseline's own reordering noise)")
    w["reason"] = f"every output numerically equal on {n} random input(s) at these shapes" if not report.rounding else f"every output {equal}"
    if result.verdict == DIVERGED:
        _label(result, probes, confirmed=False)
        result.verdict = UNPROVEN
        result.reason = f"not proven: {_stop(result)}; {equal}"
    elif result.verdict in (UNSUPPORTED, INCONCLUSIVE):
        result.reason += f" ({equal})"
    return result


_ENTRY_PARAMETER = re.compile(r"^\s*%?[\w.\-]+\s*=\s*([a-z][a-z0-9]*\[[0-9,]*\])(?:\{[^}]*\})?\s+parameter\(", re.MULTILINE)


def _parameter_bytes(text: str) -> int:
    """Bytes of the entry computation's array parameters (a lower bound of what executing the
    program holds; tuple parameters are left out, so it stays one)."""
    from ..witness.pair import _shape_bytes

    start = text.find("\nENTRY")
    return sum(_shape_bytes(m.group(1)) for m in _ENTRY_PARAMETER.finditer(text, start if start >= 0 else 0))


# Localization past a gap: at most this many instructions past it are probed (one more run).
PAST_GAP_PROBES = 64


def _past_gap(result: Result, spec: RelationSpec, texts: dict[str, str], doc: dict[str, Any], options: Any, sourcemap: Any, differing: set[int]) -> None:
    """The outputs differ but no frontier instruction does (each is a rule gap: its values hold,
    or were not checked): the difference arises past the gap, where the rules had stopped
    relating anything. The instructions past it that feed a failing output are given baseline
    counterparts — the baseline instruction of the same opcode reading the counterparts of their
    operands (proven partners, the gap's counterpart, or counterparts found so far), or for a
    failing output, the baseline output — and probed in one more run; the first, in program
    order, whose values differ becomes the first divergence. Nothing found: the frontier stays
    as it is (the witness still shows the outputs differ)."""
    # Only past gaps: every frontier instruction's values shown equal to the baseline's. One not
    # checked may itself be where the values first differ (a lossy cast at a reduction).
    if result.context is None or not result.divergences or not all(d.get("numeric") and d["numeric"]["holds"] for d in result.divergences):
        return
    from ..sourcemap import SourceMap
    from ..witness.pair import Probe
    from ..witness.service import call
    from .facts import ancestors, related
    from .localize import divergence_entry

    g, facts = result.context
    failing = {g.by_name[("distributed", o["distributed"].lstrip("%"))]: o for o in result.outputs if not o.get("ok") and ("distributed", o["distributed"].lstrip("%")) in g.by_name}
    gaps = [g.by_name[("distributed", d["instruction"].lstrip("%"))] for d in result.divergences if ("distributed", d["instruction"].lstrip("%")) in g.by_name]
    if not failing or not gaps:
        return
    live = ancestors(g, list(failing), through=lambda n: not related(facts, n))
    users: dict[int, list[int]] = {}
    for n in g.nodes:
        if n.side == "distributed":
            for o in n.operands:
                users.setdefault(o, []).append(n.gid)
    past = set(gaps)
    stack = list(gaps)
    while stack:
        for u in users.get(stack.pop(), []):
            if u in live and u not in past:
                past.add(u)
                stack.append(u)
    # Counterparts: proven partners first, then each gap's, then structural matches in order.
    partner: dict[int, int] = {}
    for d in result.divergences:
        gid = g.by_name.get(("distributed", d["instruction"].lstrip("%")))
        c = _counterpart(d)
        if gid is not None and c and ("baseline", c) in g.by_name:
            partner[gid] = g.by_name[("baseline", c)]

    def partners(o: int) -> set[int]:
        if o in partner:
            return {partner[o]}
        return {m for f in facts.by_dist.get(o, []) if f.baseline >= 0 for m in facts.members.get(f.baseline, []) if g.nodes[m].side == "baseline"}

    def literal(x: int) -> bool:  # a constant, moved: matches a baseline constant (the value is what is probed)
        while g.nodes[x].ins.opcode in ("broadcast", "reshape", "convert", "copy") and g.nodes[x].operands:
            x = g.nodes[x].operands[0]
        return g.nodes[x].ins.opcode in ("constant", "iota")

    def matches(b: int, d_ops: list[int], ops: list[set[int]]) -> bool:
        b_ops = g.nodes[b].operands
        return len(b_ops) == len(ops) and all(bo in po or (not po and literal(o) and literal(bo)) for bo, o, po in zip(b_ops, d_ops, ops, strict=True))

    by_opcode: dict[str, list[int]] = {}
    for n in g.nodes:
        if n.side == "baseline":
            by_opcode.setdefault(n.ins.opcode, []).append(n.gid)
    # A failing output the witness found different is a difference already (it is compared as
    # an output, not probed); the instructions before it are probed.
    outputs_differ = {gid for gid, o in failing.items() if any(k in differing for k, x in enumerate(result.outputs) if x is o)}
    probes: list[Any] = []
    for gid in sorted(past - set(gaps) - set(failing)):
        n = g.nodes[gid]
        ops = [partners(o) for o in n.operands]
        if not any(ops):
            continue
        found = [b for b in by_opcode.get(n.ins.opcode, []) if matches(b, n.operands, ops)]
        if len(found) != 1:
            continue
        partner[gid] = found[0]
        if len(probes) >= PAST_GAP_PROBES or (outputs_differ and gid > min(outputs_differ)):
            break
        name, bname = n.ins.name, g.nodes[partner[gid]].ins.name
        cands, unknown = probe_relations(result, spec, name, bname)
        if not unknown:
            probes.append(Probe(name, bname, relations=cands))
    report_probes: list[Any] = []
    if probes:
        try:
            report_probes = call("pair.witness", texts["baseline"], texts["distributed"], doc, options, probes).probes
        except Exception:  # a location aid only: the verdict is confirmed already
            report_probes = []
    differs = sorted([(g.by_name[("distributed", p.distributed)], p.baseline, p.detail) for p in report_probes if p.holds is False]
                     + [(gid, failing[gid]["baseline"].lstrip("%"), "an output the witness compared") for gid in outputs_differ])
    if not differs:
        return
    first_gid, first_baseline, first_detail = differs[0]
    n = g.nodes[first_gid]
    compared = len(report_probes) + len(outputs_differ)
    gap = result.divergences[0]
    entry = divergence_entry(spec, g, facts, n, sourcemap if sourcemap is not None else SourceMap())
    entry["cause"] = (f"the witness finds this {n.ins.opcode}'s values different from the baseline's %{first_baseline} ({first_detail}): the first instruction past the rule gap at "
                      f"{gap['instruction']} ({_where(gap)}) whose values differ (the rules stopped there; {compared} instruction(s) past it compared)")
    entry["kind"] = "divergence"
    entry["numeric"] = {"holds": False, "detail": first_detail}
    entry["past_gap"] = gap["instruction"]
    entry["hint"] = None
    entry["outputs"] = [o["index"] for gid, o in failing.items() if n.gid in ancestors(g, [gid])]
    for d in result.divergences:  # where the rules stopped: no difference shown there
        if d.get("kind") != "rule-gap":
            as_gap(d, f"the witness finds the first difference past it, at {entry['instruction']} ({_where(entry)})")
    result.divergences.insert(0, entry)


def _unsupported_divergence(u: dict[str, Any], texts: dict[str, str], outputs: list[int]) -> dict[str, Any]:
    """The unsupported instruction ``u`` (verify's entry: side, instruction, opcode, reason,
    line) as a divergence entry: where the rules stopped in a pair the witness found different.
    Its source is what the HLO metadata records (the run's source map is not at hand here)."""
    from ..hlo.parser import parse_hlo
    from ..sourcemap import Source, from_metadata

    name = str(u.get("instruction", "")).lstrip("%")
    source = Source("", 0, "", "its HLO metadata records no location")
    shape, op_name = None, None
    try:
        module = parse_hlo(texts[str(u.get("side"))], str(u.get("side")))
        found = [i for c in module.computations.values() for i in c.instructions if i.name == name]
        # A piece the normalizer split off (``all-reduce.5.0``) is found by its text line.
        found = found or [i for c in module.computations.values() for i in c.instructions if i.loc and i.loc.line == u.get("line")]
        if found:
            source, shape, op_name = from_metadata(found[0]), str(found[0].shape), found[0].metadata.op_name or None
    except Exception as e:  # the text parsed before; a second parse must not lose the verdict
        source = Source("", 0, "", f"its HLO text could not be read again: {type(e).__name__}")
    return {
        "instruction": f"%{name}", "opcode": u.get("opcode"), "shape": shape, "source": source.to_json(), "module": None,
        "op_name": op_name, "hlo_line": u.get("line"), "side": u.get("side"),
        "cause": f"unsupported: {u.get('reason')} (the rules stop here; the witness finds the outputs different)",
        "baseline_counterpart": None, "operands": [], "hint": None,
        # No numeric localization: an unsupported pair has no proven facts to seed a probe with.
        "kind": "divergence", "numeric": None, "outputs": outputs,
    }


def _stop(result: Result) -> str:
    """Where the rules stopped (the first frontier entry) and the outputs left unproven."""
    first = result.divergences[0] if result.divergences else None
    missing = "; ".join(f"output {o['index']} lacks {o['expected']} of {o['baseline']}" for o in result.outputs if not o.get("ok"))
    stop = f"the rules stopped at {first['instruction']} ({first['opcode']}, {_where(first)}): {first['cause']}" if first else "the rules stopped"
    return f"{stop}; {missing}" if missing else stop


def as_gap(d: dict[str, Any], evidence: str) -> None:
    """Word a frontier entry the witness does not confirm as what it is, a rule gap: the rules
    could not relate the instruction, and ``evidence`` says what the witness found. The cause
    localization wrote assumed a bug ("a reduction is missing", "puts elements in a different
    order"); it is kept as ``rules_saw`` for whoever extends the rules, and the fix ``hint``
    is dropped (there is nothing to fix in the code under review)."""
    d["kind"] = "rule-gap"
    if "rules_saw" not in d:
        d["rules_saw"] = d.get("cause")
    operands = "; ".join(f"{o['instruction']} is {o['relation']}" for o in d.get("operands") or [] if o.get("relation"))
    d["cause"] = f"the rules could not relate this {d.get('opcode')} to the baseline" + (f" (operands: {operands})" if operands else "") + f"; {evidence}"
    d["hint"] = None


def _label(result: Result, probes: list[Any], confirmed: bool) -> None:
    """kind and numeric of each divergence; the ones that really differ first. An entry that is
    no confirmed difference is worded as a rule gap (as_gap), never as a bug."""
    by_name = {p.distributed: p for p in probes}
    for d in result.divergences:
        p = by_name.get(_probed(d)["instruction"].lstrip("%"))
        d["numeric"] = None if p is None or p.holds is None else {"holds": bool(p.holds), "detail": p.detail}
        if p is not None and p.holds is None and p.detail:
            d["numeric"] = None
        holds = d["numeric"]["holds"] if d["numeric"] else None
        d["kind"] = "rule-gap" if not confirmed or holds else "divergence"
        if d["kind"] != "rule-gap":
            continue
        if confirmed:
            as_gap(d, "the witness found its values equal to the baseline's (the outputs differ elsewhere)")
        else:
            as_gap(d, "the witness found the outputs equal" + (", and this instruction's values equal to the baseline's" if holds else ""))
    order = {False: 0, None: 1, True: 2}
    result.divergences.sort(key=lambda d: order[d["numeric"]["holds"] if d["numeric"] else None])


def _unexecuted(result: Result, spec: RelationSpec, texts: dict[str, str], options: Any, w: dict[str, Any], why: str, segment_texts: dict[str, str] | None = None) -> None:
    """The verdict of a ``diverged`` pair whose outputs were not compared (``why``): it stays
    ``diverged`` (witness ``unconfirmed``) only when a diverging instruction run alone differs
    from its baseline counterpart; otherwise there is no evidence at all and it is ``unproven``
    (contract: ``diverged`` only with evidence), never a false alarm."""
    if _confirm_segments(result, spec, texts, options, w, why, segment_texts):
        result.reason += f" (witness unconfirmed: {w['reason']})"
        return
    held = [d["instruction"] for d in result.divergences if d.get("numeric") and d["numeric"]["holds"]]
    for d in result.divergences:
        held_alone = bool(d.get("numeric") and d["numeric"]["holds"])
        as_gap(d, f"not executed ({why}); " + ("run alone, the witness found its values equal to the baseline's" if held_alone else "no witness found a difference"))
    alone = (f"the diverging instruction(s) {', '.join(held)} hold numerically when run alone on inputs satisfying their operands' proven relations" if held
             else "no diverging instruction could be run alone (no baseline counterpart, operands without a relation the witness can generate, or above the budget too)")
    w["reason"] = f"{why}; {alone}"
    result.verdict = UNPROVEN
    result.reason = f"not proven: {_stop(result)}; {w['reason']}"


def _segment_relations(result: Result, spec: RelationSpec, d: dict[str, Any], b_ops: list[str], d_ops: list[str]) -> list[dict[str, Any]] | None:
    """Input entries for a cut-out instruction: each operand bound to a baseline operand by a
    proven relation the witness can generate (duplicate, sharded, partial, rank); None when an
    operand has none."""
    if result.context is None:
        return None
    g, facts = result.context
    b_gid = {}
    for j, name in enumerate(b_ops):
        gid = g.by_name.get(("baseline", name))
        if gid is None:
            return None
        b_gid[gid] = j
    entries: list[dict[str, Any]] = []
    bound: set[int] = set()
    for i, name in enumerate(d_ops):
        gid = g.by_name.get(("distributed", name))
        if gid is None:
            return None
        fs = facts.by_dist.get(gid, [])
        rng = next((m for f in fs if (m := _RANGE.match(f.relation))), None)
        entry: dict[str, Any] | None = None
        if any(f.relation == "rank" for f in fs):
            entry = {"distributed": i, "relation": "rank"}
        for f in fs if entry is None else []:
            js = [b_gid[m] for m in facts.members.get(f.baseline, []) if m in b_gid and b_gid[m] not in bound] if f.baseline >= 0 else []
            if not js:
                continue
            if f.relation == "duplicate":
                entry = {"relation": "duplicate"}
            elif (m := _SHARDED.match(f.relation)) is not None:
                entry = {"relation": "sharded", "dim": int(m.group(1))}
                if m.group(2):
                    entry["blocks"] = [int(x) for x in m.group(2).split(",") if x.strip()]
            elif (m := _PARTIAL.match(f.relation)) is not None:
                entry = {"relation": "partial", "op": m.group(1)}
            else:
                continue
            entry.update(baseline=js[0], distributed=i)
            bound.add(js[0])
            break
        if entry is None:
            return None
        if rng is not None:
            entry["int_range"] = [int(rng.group(1)), int(rng.group(2))]
        entries.append(entry)
    if bound != set(range(len(b_ops))):
        return None
    return entries


def _cut(texts: list[dict[str, str]], side: str, name: str) -> tuple[str, list[str]]:
    """Instruction ``name`` cut out of the first of ``texts`` that has it."""
    from ..witness.service import call

    for k, t in enumerate(texts):
        try:
            return call("segment.cut_instruction", t[side], name)  # type: ignore[no-any-return]
        except Exception:
            if k == len(texts) - 1:
                raise
    raise KeyError(name)


def _confirm_segments(result: Result, spec: RelationSpec, texts: dict[str, str], options: Any, w: dict[str, Any], why: str, segment_texts: dict[str, str] | None = None) -> bool:
    """Execute each diverging instruction alone, its operands seeded with their proven relations;
    the first that differs from its baseline counterpart is the (unconfirmed) evidence: True."""
    from ..witness.pair import MemoryBudgetError
    from ..witness.service import call

    for d in result.divergences:
        d.setdefault("numeric", None)
        d.setdefault("kind", "divergence")
    tried = []
    for d in result.divergences:
        name, cname = d["instruction"].lstrip("%"), _counterpart(d)
        if cname is None:
            continue
        try:
            sources = [segment_texts, texts] if segment_texts else [texts]
            d_text, d_ops = _cut(sources, "distributed", name)
            b_text, b_ops = _cut(sources, "baseline", cname)
        except Exception:  # not an instruction of the text (renamed by the normalizer)
            continue
        inputs = _segment_relations(result, spec, d, b_ops, d_ops)
        if inputs is None:
            continue
        cands, unknown = probe_relations(result, spec, name, cname)
        if unknown:
            d["numeric_note"] = f"not checked: relation unknown ({unknown})"
            continue
        try:
            out = call("pair.instruction_differs", b_text, d_text, {"groups": spec.groups, "inputs": inputs, "candidates": cands}, options)
        except MemoryBudgetError:
            continue
        except Exception as e:
            tried.append(f"{d['instruction']}: {type(e).__name__}")
            continue
        if out is None:
            continue
        differs, chk, seed, trials, check = out
        d["numeric"] = {"holds": not differs, "detail": chk}
        d["kind"] = "divergence" if differs else "rule-gap"
        if not differs:
            as_gap(d, "run alone, the witness found its values equal to the baseline's")
        if differs:
            # Not "confirmed": no output was compared, and the instruction's counterpart is only
            # the baseline instruction reading the same operands, not a value it must equal.
            w["status"] = "unconfirmed"
            w["seeds"] = [seed]
            w["trials"] = trials
            if check is not None:
                w["outputs"] = [check.to_json(d.get("outputs", [0])[0] if d.get("outputs") else 0) | {"segment": d["instruction"]}]
            w["segment"] = {"instruction": d["instruction"], "baseline": "%" + cname, "source": _where(d), "op_name": d.get("op_name"), "inputs": inputs}
            w["reason"] = (f"the diverging instruction {d['instruction']} ({d['opcode']}, {_where(d)}" + (f", {d['op_name']}" if d.get("op_name") else "")
                           + f") run alone {chk} (its baseline counterpart %{cname}, inputs satisfying its operands' proven relations); {why}")
            break
    order = {False: 0, None: 1, True: 2}
    result.divergences.sort(key=lambda x: order[x["numeric"]["holds"] if x.get("numeric") else None])
    return w["status"] == "unconfirmed"


# Numeric localization compares a probe under a relation its value is known to have (or, for a
# frontier instruction, would have if right): carried from its operands' proven relations, and
# for a reshape/transpose tracked element by element. A shape guess alone is wrong where a
# sharded dim is merged with an outer one (Megatron's (b, heads) -> b·heads: the merged dim is
# sharded in blocks, one per batch entry), so such a probe is compared under the blocked relation
# or not at all.
_INDEX_LIMIT = 1 << 22  # elements of the index arrays a reshape is tracked with
_MOVES = ("reshape", "transpose")
_SAME = ("convert", "copy", "negate", "abs", "exponential", "log", "tanh", "logistic", "sqrt", "rsqrt", "add", "subtract", "multiply", "divide", "maximum", "minimum", "select", "compare", "power")


def _entry_of(relation: str) -> dict[str, Any] | None:
    """A proven relation as a witness entry (duplicate, sharded with its blocks, partial)."""
    if relation == "duplicate":
        return {"relation": "duplicate"}
    if (m := _SHARDED.match(relation)) is not None:
        e: dict[str, Any] = {"relation": "sharded", "dim": int(m.group(1))}
        if m.group(2):
            e["blocks"] = [int(x) for x in m.group(2).split(",") if x.strip()]
        return e
    if (m := _PARTIAL.match(relation)) is not None:
        return {"relation": "partial", "op": m.group(1)}
    return None


def _plain(g: Any, facts: Any, o: int, b_operand: int | None = None) -> list[dict[str, Any]]:
    """The witness entries of operand ``o``'s proven relations (to ``b_operand`` when given)."""
    out = []
    for f in facts.by_dist.get(o, []):
        if f.baseline < 0:
            continue
        members = [m for m in facts.members.get(f.baseline, []) if g.nodes[m].side == "baseline"]
        if not members or (b_operand is not None and b_operand not in members):
            continue
        e = _entry_of(f.relation)
        if e is not None and e not in out:
            out.append(e)
    return out


def _order_safe(facts: Any, o: int, entries: list[dict[str, Any]]) -> bool:
    """Operand ``o`` keeps the baseline's element order along its dims (so the shapes' guess of
    the result's relation is right): it has a plain unblocked relation, or none of its relations
    reorders elements (a layout bijection, a sharding in blocks). Other relations (scaled, rank,
    ranges, none) say nothing about the order; a wrong value there is what the probe is for."""
    if any("blocks" not in e for e in entries):
        return True
    return not any(f.relation.startswith("layout(") or "blocks" in f.relation for f in facts.by_dist.get(o, []))


def _moved(x: Any, ins: Any, shape: tuple[int, ...]) -> Any:
    if ins.opcode == "reshape":
        return x.reshape(shape)
    perm = ins.parsed.get("dimensions")
    if not perm or sorted(perm) != list(range(x.ndim)):
        raise ValueError("transpose without a permutation")
    return x.transpose([int(p) for p in perm])


def track_relation(entry: dict[str, Any], c: int, d_ins: Any, b_ins: Any, d_in: tuple[int, ...], b_in: tuple[int, ...]) -> dict[str, Any] | None:
    """The relation of a reshape/transpose's result given its operand's (``entry``), found by
    moving the baseline's element indices through both programs' op: the first of sharded along
    the dim that differs c-fold in m equal blocks (m = 1: plain) whose rank pieces are exactly the
    distributed indices; None when no such relation describes the result."""
    import numpy as np

    from ..witness.inputs import split

    d_out, b_out = tuple(d_ins.shape.dims), tuple(b_ins.shape.dims)
    size = 1
    for s in b_in:
        size *= s
    if entry["relation"] in ("duplicate", "partial"):
        # Both copies (or every rank's piece of the sum) moved alike: the relation carries.
        same = d_in == b_in and d_out == b_out and d_ins.opcode == b_ins.opcode and d_ins.parsed.get("dimensions") == b_ins.parsed.get("dimensions")
        return dict(entry) if same else None
    if size > _INDEX_LIMIT:
        return None
    idx = np.arange(size).reshape(b_in)
    try:
        pieces = [_moved(p, d_ins, d_out) for p in split(idx, entry["dim"] % len(b_in), c, entry.get("blocks"), "probe")]
        base = _moved(idx, b_ins, b_out)
    except ValueError:
        return None
    if len(d_out) != len(b_out):
        return None
    diff = [k for k in range(len(b_out)) if b_out[k] != d_out[k]]
    if len(diff) != 1 or b_out[diff[0]] != c * d_out[diff[0]]:
        return None
    k, n = diff[0], b_out[diff[0]]
    for m in range(1, n + 1):
        if n % m or (n // m) % c:
            continue
        blocks = [n // m] * m if m > 1 else None
        if all(np.array_equal(a, b) for a, b in zip(split(base, k, c, blocks, "probe"), pieces, strict=True)):
            return {"relation": "sharded", "dim": k, **({"blocks": blocks} if blocks else {})}
    return None


# Ops that move or select elements along some dims: along a sharded dim, the shapes' guess
# (plain sharded) is wrong (a concatenate of shards is sharded in blocks; a slice of a shard is
# no shard of the baseline's slice).
_ALONG = ("concatenate", "slice", "pad", "reverse", "dynamic-slice", "dynamic-update-slice", "gather", "scatter", "reduce-window", "select-and-scatter", "sort", "iota")


def _along(g: Any, facts: Any, n: Any, b: Any, sharded: set[int]) -> tuple[list[dict[str, Any]], str]:
    ins = n.ins
    if ins.opcode == "concatenate" and len(sharded) == 1:
        k = next(iter(sharded))
        cat = (ins.parsed.get("dimensions") or [None])[0]
        if cat != k:
            return [], ""
        rels = [_plain(g, facts, o, bo) for o, bo in zip(n.operands, b.operands, strict=False)]
        if len(b.operands) == len(n.operands) and all({"relation": "sharded", "dim": k} in rs for rs in rels):
            # rank r holds piece r of every operand, one after the other: blocks of the operands' sizes.
            return [{"relation": "sharded", "dim": k, "blocks": [g.nodes[bo].ins.shape.dims[k] for bo in b.operands]}], ""
        return [], f"this concatenate along the sharded dim {k} joins operands without one sharding the witness can combine"
    if ins.opcode in ("slice", "pad") and n.operands:
        src = tuple(g.nodes[n.operands[0]].ins.shape.dims)
        if all(src[k] == ins.shape.dims[k] for k in sharded if k < len(src)):
            return [], ""  # the sharded dim is untouched
    if ins.opcode == "reverse" and not sharded & set(ins.parsed.get("dimensions") or []):
        return [], ""
    return [], f"this {ins.opcode} works along the sharded dim {sorted(sharded)}: its result is no plain shard of the baseline's"


def probe_relations(result: Result, spec: RelationSpec, name: str, partner: str | None) -> tuple[list[dict[str, Any]], str]:
    """(candidate relations for probing distributed ``name`` against baseline ``partner``, why
    not: "" when it can be probed). An empty list lets the witness infer the candidates from the
    shapes (duplicate, partial, sharded along the one dim that differs c-fold), which is right
    only when every operand keeps the baseline's element order (_order_safe) and the op does not
    work along a sharded dim (_along); a reshape/transpose is tracked (track_relation)."""
    if result.context is None or partner is None:
        return [], ""  # the witness finds no counterpart to compare with either
    g, facts = result.context
    gid, bid = g.by_name.get(("distributed", name)), g.by_name.get(("baseline", partner))
    if gid is None or bid is None:
        return [], ""
    n, b = g.nodes[gid], g.nodes[bid]
    if n.ins.opcode in _COLLECTIVES:
        return [], ""  # compared with the value its operand stands for (_collective_partner)
    if n.ins.opcode in _MOVES and len(n.operands) == 1 and len(b.operands) == 1 and b.ins.opcode in _MOVES:
        o, bo = n.operands[0], b.operands[0]
        for e in _plain(g, facts, o, bo):
            r = track_relation(e, spec.c, n.ins, b.ins, tuple(g.nodes[o].ins.shape.dims), tuple(g.nodes[bo].ins.shape.dims))
            if r is not None:
                return [r], ""
        if tuple(g.nodes[o].ins.shape.dims) == tuple(g.nodes[bo].ins.shape.dims) and tuple(n.ins.shape.dims) == tuple(b.ins.shape.dims):
            return [], ""  # same shapes on both sides: only duplicate or partial are guessed
        return [], f"no proven relation of operand %{g.nodes[o].ins.name} carries through this {n.ins.opcode} to one the witness can compare under"
    rels = [_plain(g, facts, o) for o in n.operands]
    if all(_order_safe(facts, o, rs) for o, rs in zip(n.operands, rels, strict=True)):
        sharded = {e["dim"] % max(1, len(n.ins.shape.dims)) for rs in rels for e in rs if e["relation"] == "sharded"}
        if not sharded or n.ins.opcode not in _ALONG:
            return [], ""
        return _along(g, facts, n, b, sharded)
    blocked = [e for rs in rels for e in rs if "blocks" in e]
    if n.ins.opcode in _SAME and blocked and all(tuple(g.nodes[o].ins.shape.dims) == tuple(n.ins.shape.dims) for o in n.operands):
        return [blocked[0]], ""  # elementwise: the blocked sharding carries
    bad = next(o for o, rs in zip(n.operands, rels, strict=True) if not _order_safe(facts, o, rs))
    return [], f"operand %{g.nodes[bad].ins.name} is {_facts_text(facts, bad)}, which the witness cannot carry through this {n.ins.opcode}"


def _facts_text(facts: Any, o: int) -> str:
    fs = [f.relation for f in facts.by_dist.get(o, [])]
    return ", ".join(fs[:2]) or "no relation"
