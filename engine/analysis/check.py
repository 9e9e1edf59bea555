"""Check a pair of HLO files: fold repeated layers, verify, and verify unfolded when needed.

Folding (hlo.fold) is a shortcut to the answer "verified": every fact it yields is proven, but
what it cannot prove it cannot explain as well as the whole pair can. So a folded run that is
not verified — diverged, unsupported, inconclusive, or a pair that does not cut where the text
did — is run again unfolded, and that run's answer, localization and trace are the result.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from ..errors import InputError, phase
from ..hlo.fold import fold
from ..hlo.parser import parse_hlo
from ..ir import Module
from ..relations import RelationSpec
from ..sourcemap import SourceMap
from .folded import FoldMismatch
from .partition import DEFAULT_LAYER_PATTERN
from .verify import VERIFIED, Budget, Result, verify

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


def check_files(spec: RelationSpec, baseline: str | Path, distributed: str | Path, sourcemap: SourceMap | None = None, budget: Budget | None = None, witness: str = "auto", witness_options: Any = None) -> Result:
    """Verify the pair in the two files, then let the numeric witness (engine.witness, see
    analysis.witnessing) confirm or refute what the rules could not prove: ``witness`` is
    ``auto`` (non-verified outcomes), ``always`` (verified pairs too) or ``never``.
    ``witness_options`` may be a function returning them, called only when the witness runs
    (engine.witness imports numpy, ~50 ms of a check that most often verifies without it)."""
    result = _check_files(spec, baseline, distributed, sourcemap, budget)
    if witness == "never" or (witness == "auto" and result.verdict == VERIFIED):
        return result
    from . import witnessing

    t = time.perf_counter()
    paths = {"baseline": os.fspath(baseline), "distributed": os.fspath(distributed)}
    with phase("witness", f"{paths['baseline']} / {paths['distributed']}"):
        texts = {side: read_hlo(p) for side, p in paths.items()}
        options = witness_options() if callable(witness_options) else witness_options
        result = witnessing.apply(result, spec, paths, texts, witness, options)
    result.timings["witness"] = time.perf_counter() - t
    return result


def _check_files(spec: RelationSpec, baseline: str | Path, distributed: str | Path, sourcemap: SourceMap | None = None, budget: Budget | None = None) -> Result:
    """Verify the pair in the two files; timings include reading and parsing them."""
    budget = budget or Budget()
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
            try:
                t = time.perf_counter()
                base = _parse(f.baseline_text, paths["baseline"], " (folded)")
                dist = _parse(f.distributed_text, paths["distributed"], " (folded)")
                timings["parse"] = time.perf_counter() - t
                result = verify(spec, base, dist, sm, budget, fold=f)
                if result.verdict == VERIFIED:
                    result.timings = {**timings, **result.timings}
                    result.stats["fold"] = note
                    return result
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
    base = _parse(texts["baseline"], paths["baseline"])
    dist = _parse(texts["distributed"], paths["distributed"])
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
