"""Result documents for the bot's tests, built from the committed torch-xla pairs.

The front end (``shardproof run``) will produce these; until then the verifier is run directly on
``tests/pairs/<name>/`` and its result wrapped in the runner's document shape.
"""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo_file
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap

ROOT = Path(__file__).resolve().parent.parent
PAIRS = Path("tests/pairs")  # repository-relative, as the front end names artifacts


@functools.cache
def _model(name: str) -> dict[str, Any]:
    d = ROOT / PAIRS / name
    t = time.perf_counter()
    sm = SourceMap.load(d / "sourcemap.json") if (d / "sourcemap.json").exists() else None
    res = verify(load_relations(d / "relations.yaml"), parse_hlo_file(d / "baseline.hlo"), parse_hlo_file(d / "distributed.hlo"), sm)
    rel = PAIRS / name
    return {
        "name": name,
        "status": res.verdict,
        "seconds": round(time.perf_counter() - t, 3),
        "build": {"seconds": 0.0, "peak_rss_mb": 0.0, "error": None},
        "result": res.to_json(),
        "artifacts": {
            "baseline": str(rel / "baseline.hlo"),
            "distributed": str(rel / "distributed.hlo"),
            "relations": str(rel / "relations.yaml"),
            "sourcemap": str(rel / "sourcemap.json"),
        },
    }


def model(name: str) -> dict[str, Any]:
    return copy.deepcopy(_model(name))


def build_failed(name: str, error: str) -> dict[str, Any]:
    return {"name": name, "status": "build-failed", "seconds": 0.5, "build": {"seconds": 0.5, "peak_rss_mb": 100.0, "error": error}, "artifacts": {}}


def run_doc(*models: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "config": ".shardproof.yml", "repository_root": ".", "models": list(models)}


def bug_site(name: str) -> tuple[str, int]:
    """The line of ``tests/pairs/models.py`` marked ``# BUG-SITE: <name>``: where the bug is."""
    path = PAIRS / "models.py"
    for n, text in enumerate((ROOT / path).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# BUG-SITE: {name}"):
            return path.as_posix(), n
    raise LookupError(f"no BUG-SITE marker for {name}")
