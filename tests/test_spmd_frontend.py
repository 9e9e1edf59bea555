"""``framework: torch-xla-spmd``: shardings annotated on a mesh, the per-device program that
XLA's SPMD partitioner wrote (4 virtual CPU devices) verified against the un-annotated
baseline; relations derived from the specs. One correct model (verified) and one bug variant
(diverged, confirmed by the witness, at its line)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardproof.engine.frontend.runner import run_models

pytest.importorskip("torch_xla")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests/spmd_project"


def test_spmd_models_verify_what_the_partitioner_wrote(tmp_path: Path) -> None:
    doc = run_models(PROJECT / ".shardproof.yml", tmp_path / "out")
    by = {m["name"]: m for m in doc["models"]}
    assert {n: m["status"] for n, m in by.items()} == {"spmd_mlp": "verified", "spmd_mlp_averaged": "diverged"}, doc
    good = tmp_path / "out/spmd_mlp"
    dist = (good / "distributed.hlo").read_text()
    # The partitioner's output: per-device shapes and the all-reduce it inserted for the
    # row-parallel product; the baseline has the whole weights and no collective.
    assert "num_partitions=4" in dist.split("\n", 1)[0] and " all-reduce(" in dist
    assert "f32[32,64]" in (good / "baseline.hlo").read_text() and " all-reduce(" not in (good / "baseline.hlo").read_text()
    relations = yaml.safe_load((good / "relations.yaml").read_text())
    assert relations["groups"] == [[0, 1, 2, 3]]
    assert sorted((r["relation"], r.get("dim")) for r in relations["inputs"]) == [("duplicate", None), ("sharded", 0), ("sharded", 1)]
    bug = by["spmd_mlp_averaged"]["result"]
    line = next(n for n, text in enumerate((PROJECT / "models.py").read_text().splitlines(), 1) if text.endswith("# BUG-SITE: averaged_over_tp"))
    assert bug["divergences"][0]["source"]["file"] == "tests/spmd_project/models.py"
    assert bug["divergences"][0]["source"]["line"] == line
    assert bug["witness"]["status"] == "confirmed"
