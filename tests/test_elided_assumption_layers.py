"""The elided-constants assumption equates namesakes only, also where the pair is cut into
layers and a layer reuses an earlier layer's proof (tests/soundness_regressions/
elided_constants_swapped_across_layers). Each claim is checked against XLA's execution of the
pair with the namesakes filled alike (what the assumption means, analysis.check.executable_text)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.check import check_files, executable_text
from shardproof.engine.relations import load_relations

CASE = Path(__file__).parent / "soundness_regressions" / "elided_constants_swapped_across_layers"


def _pair(tmp_path: Path, dist_names: list[str]) -> tuple[Path, Path]:
    """The regression's baseline, and its distributed program with layer i reading ``dist_names[i]``."""
    text = (CASE / "distributed.hlo").read_text()
    for i, name in enumerate(dist_names):
        # every layer's constant line and its one use, renamed by layer
        text = re.sub(rf"%c\d+(?= = f32\[16\]\{{0\}} constant\(\{{\.\.\.\}}\), metadata=\{{[^}}]*layers\.{i}/)", f"%{name}", text)
        text = re.sub(rf"(%m{i} = f32\[16\]\{{0\}} multiply\(f32\[16\]\{{0\}} %\S+, f32\[16\]\{{0\}} )%\w+", rf"\g<1>%{name}", text)
    (tmp_path / "distributed.hlo").write_text(text)
    return CASE / "baseline.hlo", tmp_path / "distributed.hlo"


def _executes_equal(base: Path, dist: Path, names: list[str]) -> bool:
    oracle = pytest.importorskip("oracle")
    relations = yaml.safe_load((CASE / "relations.yaml").read_text())
    texts = [executable_text(p.read_text(), names) for p in (base, dist)]
    return all(oracle.run_pair(texts[0], texts[1], relations, seed=s).equal for s in (0, 1))


@pytest.mark.parametrize("partition", [True, False])
def test_namesakes_swapped_between_layers_are_not_verified(partition: bool) -> None:
    from shardproof.engine.analysis.verify import Budget

    spec = load_relations(CASE / "relations.yaml")
    result = check_files(spec, CASE / "baseline.hlo", CASE / "distributed.hlo", budget=Budget(partition=partition), witness="never")
    assert result.verdict != "verified", result.reason
    assert not _executes_equal(CASE / "baseline.hlo", CASE / "distributed.hlo", ["c0", "c1", "c2"])


def test_namesakes_in_the_same_layers_verify_and_share_one_proof(tmp_path: Path) -> None:
    base, dist = _pair(tmp_path, ["c0", "c1", "c2"])
    result = check_files(load_relations(CASE / "relations.yaml"), base, dist, witness="never")
    assert result.verdict == "verified", result.reason
    assert result.stats["segments_reused"] >= 1, result.stats  # the layers pair their namesakes alike
    assert _executes_equal(base, dist, ["c0", "c1", "c2"])


def test_constants_without_namesakes_stay_unknown_in_every_layer(tmp_path: Path) -> None:
    # Layers 1 and 2 have the structure of layer 0 but constants the baseline has no name for.
    base, dist = _pair(tmp_path, ["c0", "k1", "k2"])
    result = check_files(load_relations(CASE / "relations.yaml"), base, dist, witness="never")
    assert result.verdict == "unsupported", result.reason
    assert "k1" in result.reason
