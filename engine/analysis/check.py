"""Check a pair of HLO files: fold repeated layers, verify, and verify unfolded when needed.

Folding (hlo.fold) is a shortcut to the answer "verified": every fact it yields is proven, but
what it cannot prove it cannot explain as well as the whole pair can. So a folded run that is
not verified — diverged, unsupported, inconclusive, or a pair that does not cut where the text
did — is run again unfolded, and that run's answer, localization and trace are the result.

One exception saves a bug run the unfolded run (most of its time at production size): a folded
run that is ``diverged`` is first shown to the witness. Its facts are proven (folding loses
completeness, never soundness), so a witness that finds the outputs different, or the diverging
instruction different when run alone on inputs satisfying those facts, is evidence of a bug
whatever an unfolded run could add; that result stands. Anything less (equal, not executed, no
instruction differing alone) and the pair is run unfolded as before.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import Any

from ..errors import InputError, phase
from ..hlo.flavours import neuron_executable
from ..hlo.fold import fold
from ..hlo.literals import assume_elided_equal
from ..hlo.parser import parse_hlo
from ..ir import Module
from ..relations import ASSUMPTION_TEXT, RelationSpec
from ..sourcemap import SourceMap
from .folded import FoldMismatch
from .partition import DEFAULT_LAYER_PATTERN
from .verify import DIVERGED, UNSUPPORTED, VERIFIED, Budget, Result, verify

# A partitioned run that is not verified is run again as one e-graph when the pair has at most
# this many entry instructions (both sides): the cut may have hidden an equality. Tens of layers
# of a small model; a production-sized pair (10^4-10^5 instructions) keeps the cut's answer.
WHOLE_RERUN_MAX_INSTRUCTIONS = 3000


def read_hlo(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise InputError(p, "", f"cannot read HLO file: {e.strerror or e}") from e


def _parse(text: str, path: str, note: str = "") -> Module:
    with phase("parse", path + note):
        return parse_hlo(text, path)


def _parse_pair(spec: RelationSpec, texts: dict[str, str], paths: dict[str, str], note: str, assumed: dict[str, Any]) -> tuple[Module, Module]:
    """Both modules parsed; with the elided-constants assumption, each elided constant with a
    namesake of the same shape and type in the other program marked assumed equal to it
    (hlo.literals.assume_elided_equal). ``assumed`` receives the pairs and what stayed unknown."""
    base = _parse(texts["baseline"], paths["baseline"], note)
    dist = _parse(texts["distributed"], paths["distributed"], note)
    if "elided-constants" in spec.assume:
        pairs, left = assume_elided_equal(base, dist)
        assumed["pairs"], assumed["left"] = pairs, left
    return base, dist


def _assumptions(spec: RelationSpec, assumed: dict[str, Any]) -> list[dict[str, Any]]:
    """Result.assumptions: the assumptions the verdict rests on. One the user stated but that
    equated nothing is not listed: no step of the run used it."""
    pairs = assumed.get("pairs") or []
    if "elided-constants" not in spec.assume or not pairs:
        return []
    return [{"name": "elided-constants", "text": ASSUMPTION_TEXT["elided-constants"], "constants": [p.to_json() for p in pairs], "not_assumed": list(assumed.get("left") or [])}]


def verdict_label(verdict: str, assumptions: list[dict[str, Any]]) -> str:
    """The verdict as printed: ``verified (assuming elided constants equal by name)`` when it
    rests on assumptions, so no one reads it as an unconditional proof."""
    if not assumptions:
        return verdict
    return f"{verdict} (assuming {'; '.join(a['text'] for a in assumptions)})"


def check_files(spec: RelationSpec, baseline: str | Path, distributed: str | Path, sourcemap: SourceMap | None = None, budget: Budget | None = None, witness: str = "auto", witness_options: Any = None) -> Result:
    """Verify the pair in the two files, then let the numeric witness (engine.witness, see
    analysis.witnessing) confirm or refute what the rules could not prove: ``witness`` is
    ``auto`` (non-verified outcomes), ``always`` (verified pairs too) or ``never``.
    ``witness_options`` may be a function returning them, called only when the witness runs
    (engine.witness imports numpy, ~50 ms of a check that most often verifies without it)."""
    assumed: dict[str, Any] = {}
    paths = {"baseline": os.fspath(baseline), "distributed": os.fspath(distributed)}
    evidence = None
    if witness != "never":

        def evidence(folded: Result, folded_texts: dict[str, str]) -> Result | None:
            """The folded run's divergence with the witness's evidence, or None (run unfolded)."""
            if folded.verdict != DIVERGED or not folded.divergences:
                return None
            folded.assumptions = _assumptions(spec, assumed)
            t = time.perf_counter()
            witnessed = _witness(spec, folded, paths, witness, witness_options, folded_texts, sourcemap)
            folded.timings["witness"] = time.perf_counter() - t
            status = (witnessed.witness or {}).get("status")
            return witnessed if witnessed.verdict == DIVERGED and status in ("confirmed", "unconfirmed") else None

    result = _check_files(spec, baseline, distributed, sourcemap, budget, assumed, evidence)
    if result.witness is not None:  # the folded run's divergence, witnessed already
        return result
    result.assumptions = _assumptions(spec, assumed)
    if result.verdict == UNSUPPORTED and assumed.get("left"):
        result.reason += " Not assumed equal (elided-constants equates namesakes of one shape and type only): " + "; ".join(assumed["left"]) + "."
    if result.verdict == UNSUPPORTED and "elided-constants" not in spec.assume and any(u.get("opcode") == "constant" and "{...}" in str(u.get("reason")) for u in result.unsupported):
        result.reason += (" Or, when each elided constant of the distributed program is the baseline's constant of the same name, shape and type, "
                          "state that assumption: `--assume elided-constants` (relations `assume: [elided-constants]`); the verdict then names it.")
    if witness == "never" or (witness == "auto" and result.verdict == VERIFIED):
        return result
    t = time.perf_counter()
    result = _witness(spec, result, paths, witness, witness_options, sourcemap=sourcemap)
    result.timings["witness"] = time.perf_counter() - t
    return result


def _witness(spec: RelationSpec, result: Result, paths: dict[str, str], witness: str, witness_options: Any, segment_texts: dict[str, str] | None = None, sourcemap: SourceMap | None = None) -> Result:
    """witnessing.apply on the pair's executable texts; ``segment_texts`` (the folded texts of a
    folded run) are where a diverging instruction is cut out from, when it is there."""
    from . import witnessing

    with phase("witness", f"{paths['baseline']} / {paths['distributed']}"):
        names = [c["name"].lstrip("%") for a in result.assumptions for c in a["constants"]]
        texts = {side: executable_text(read_hlo(p), names) for side, p in paths.items()}
        options = witness_options() if callable(witness_options) else witness_options
        segments = {side: executable_text(text, names) for side, text in segment_texts.items()} if segment_texts else None
        result = witnessing.apply(result, spec, paths, texts, witness, options, segments, sourcemap)
        if result.assumptions and result.witness and result.witness.get("command"):
            # (said even when the relations file states it too: the command works either way)
            result.witness["command"] += " --assume elided-constants"
    return result


def odd_layers(f: Any) -> list[int]:
    """Layers left unfolded between two folded layers of one class: a stack whose layer k alone
    differs from its neighbours (a bug in that layer, most often; or a model with one special
    layer in the middle)."""
    # Over neighbouring folded layers, not the range between the first and last: a training
    # step's backward layers are numbered from BACKWARD_BASE down, so that range is ~2^40 long.
    ks = sorted(f.layers)
    return [a + 1 for a, b in itertools.pairwise(ks) if b == a + 2 and f.layers[a].cls == f.layers[b].cls]


_WARM = "HloModule warm\n\nENTRY %warm (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n"


def _warm_witness() -> None:
    """Start the witness's worker (a process that imports jax: about a second) in the background,
    while the folded run proves the pair: a pair with an odd layer is likely to need the witness,
    and then its worker is ready. Only a speculation: nothing waits for it, a failure is ignored,
    and a verified pair with an odd layer pays only the worker's start-up."""
    import contextlib
    import threading

    def warm() -> None:
        from ..witness.service import call

        with contextlib.suppress(Exception):  # the real call reports what is wrong with the worker
            call("segment.cut_instruction", _WARM, "p")

    threading.Thread(target=warm, name="shardproof-witness-warm", daemon=True).start()


def executable_text(text: str, assumed_equal: list[str]) -> str:
    """The text the witness executes: each elided constant named in ``assumed_equal`` filled
    (the same values in both programs: the assumption, executed; engine.witness.inputs), and
    Neuron's custom-calls spelled out in plain HLO (hlo.flavours.neuron_executable)."""
    if assumed_equal:
        from ..witness.inputs import fill_elided

        text = fill_elided(text, assumed_equal)
    return neuron_executable(text)


def _check_files(spec: RelationSpec, baseline: str | Path, distributed: str | Path, sourcemap: SourceMap | None = None, budget: Budget | None = None, assumed: dict[str, Any] | None = None, evidence: Any = None) -> Result:
    """Verify the pair in the two files; timings include reading and parsing them. ``evidence``
    (folded result, folded texts) -> a witnessed result or None: a folded run's divergence that
    it returns a result for is the answer (no unfolded run)."""
    budget = budget or Budget()
    assumed = {} if assumed is None else assumed
    sm = sourcemap or SourceMap()
    paths = {"baseline": os.fspath(baseline), "distributed": os.fspath(distributed)}
    t = time.perf_counter()
    texts = {}
    for side, p in paths.items():
        with phase("read", p):
            texts[side] = read_hlo(p)
    timings: dict[str, float] = {"read": time.perf_counter() - t}
    note: dict[str, object] = {"folded_layers": 0}
    if budget.fold and budget.partition:
        t = time.perf_counter()
        op_names = {"baseline": lambda name, md: md, "distributed": sm.op_name_of}
        try:
            with phase("fold", f"{paths['baseline']} / {paths['distributed']}"):
                f = fold(texts["baseline"], texts["distributed"], op_names, budget.layer_pattern or DEFAULT_LAYER_PATTERN, paths)
        except Exception as e:  # the fold is a shortcut: when it fails, the whole pair answers
            f = None
            note["unfolded_because"] = f"the fold failed ({type(e).__name__}: {e})"
        timings["fold"] = time.perf_counter() - t
        if f is not None:
            note["folded_layers"] = len(f.layers)
            if evidence is not None and odd_layers(f):
                _warm_witness()
            try:
                t = time.perf_counter()
                base, dist = _parse_pair(spec, {"baseline": f.baseline_text, "distributed": f.distributed_text}, paths, " (folded)", assumed)
                timings["parse"] = time.perf_counter() - t
                result = verify(spec, base, dist, sm, budget, fold=f)
                if result.verdict == VERIFIED:
                    result.timings = {**timings, **result.timings}
                    result.stats["fold"] = note
                    return result
                witnessed = evidence(result, {"baseline": f.baseline_text, "distributed": f.distributed_text}) if evidence is not None else None
                if witnessed is not None:
                    witnessed.timings = {**timings, **witnessed.timings}
                    witnessed.stats["fold"] = {**note, "witnessed_folded": True}
                    return witnessed
                note["unfolded_because"] = f"folded run {result.verdict}: {result.reason}"
            except FoldMismatch as e:
                note["unfolded_because"] = f"the parsed pair does not cut where the text fold did ({e})"
            except InputError as e:
                note["unfolded_because"] = f"bad input ({e}); the whole pair says where"
            except Exception as e:  # never an answer from a broken shortcut
                note["unfolded_because"] = f"the folded run failed ({type(e).__name__}: {e})"
            timings = {k: v for k, v in timings.items() if k in ("read", "fold")}
            timings["folded_run"] = sum(result.timings.values()) if "result" in locals() else 0.0
    t = time.perf_counter()
    base, dist = _parse_pair(spec, texts, paths, "", assumed)
    timings["parse"] = time.perf_counter() - t
    result = verify(spec, base, dist, sm, budget)
    if result.verdict != VERIFIED and result.stats.get("segments", 1) > 1 and len(base.entry.instructions) + len(dist.entry.instructions) <= WHOLE_RERUN_MAX_INSTRUCTIONS:
        # Cutting at layer boundaries only loses completeness: an equality that needs both
        # sides of a cut (an instruction whose op_name names another layer than its
        # counterpart's) is not found. A small pair is asked again as one e-graph before the
        # cut's answer stands; a real bug costs one more (small) run.
        t = time.perf_counter()
        whole = verify(spec, base, dist, sm, dataclasses.replace(budget, partition=False))
        if whole.verdict == VERIFIED:
            note["whole_graph_because"] = f"partitioned run {result.verdict}: {result.reason}"
            timings["partitioned_run"] = sum(result.timings.values())
            result = whole
        else:
            timings["whole_rerun"] = time.perf_counter() - t
    result.timings = {**timings, **result.timings}
    result.stats["fold"] = note
    return result
