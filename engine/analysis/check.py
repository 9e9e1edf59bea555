"""Check a pair of HLO files: fold repeated layers, verify, and verify unfolded when needed.

Folding (hlo.fold) is a shortcut to the answer "verified": every fact it yields is proven, but
what it cannot prove it cannot explain as well as the whole pair can. So a folded run that is
not verified — diverged, unsupported, inconclusive, or a pair that does not cut where the text
did — is run again unfolded, and that run's answer, localization and trace are the result.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import InputError
from ..hlo.fold import fold
from ..hlo.parser import parse_hlo
from ..relations import RelationSpec
from ..sourcemap import SourceMap
from .folded import FoldMismatch
from .partition import DEFAULT_LAYER_PATTERN
from .verify import VERIFIED, Budget, Result, verify


def read_hlo(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise InputError(p, "", f"cannot read HLO file: {e.strerror or e}") from e


def check_files(spec: RelationSpec, baseline: str | Path, distributed: str | Path, sourcemap: SourceMap | None = None, budget: Budget | None = None) -> Result:
    """Verify the pair in the two files; timings include reading and parsing them."""
    budget = budget or Budget()
    sm = sourcemap or SourceMap()
    paths = {"baseline": os.fspath(baseline), "distributed": os.fspath(distributed)}
    t = time.perf_counter()
    texts = {side: read_hlo(p) for side, p in paths.items()}
    timings: dict[str, float] = {"read": time.perf_counter() - t}
    note: dict[str, object] = {"folded_layers": 0}
    if budget.fold and budget.partition:
        t = time.perf_counter()
        op_names = {"baseline": lambda name, md: md, "distributed": sm.op_name_of}
        try:
            f = fold(texts["baseline"], texts["distributed"], op_names, budget.layer_pattern or DEFAULT_LAYER_PATTERN, paths)
        except Exception as e:  # the fold is a shortcut: when it fails, the whole pair answers
            f = None
            note["unfolded_because"] = f"the fold failed ({type(e).__name__}: {e})"
        timings["fold"] = time.perf_counter() - t
        if f is not None:
            note["folded_layers"] = len(f.layers)
            try:
                t = time.perf_counter()
                base = parse_hlo(f.baseline_text, paths["baseline"])
                dist = parse_hlo(f.distributed_text, paths["distributed"])
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
    base = parse_hlo(texts["baseline"], paths["baseline"])
    dist = parse_hlo(texts["distributed"], paths["distributed"])
    timings["parse"] = time.perf_counter() - t
    result = verify(spec, base, dist, sm, budget)
    result.timings = {**timings, **result.timings}
    result.stats["fold"] = note
    return result
