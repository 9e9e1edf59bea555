"""The verifier gaps under tests/gaps/: each pair is what its README says (the numeric oracle
agrees where it runs). Closed gaps must stay closed; open ones are strict expected failures, so
fixing one makes its test fail until it is listed in CLOSED (and in tests/gaps/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bug_sites import bug_sites

from shardproof.engine.analysis.verify import Budget, verify
from shardproof.engine.frontend.config import load_config
from shardproof.engine.hlo.parser import parse_hlo_file
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap

GAPS = Path(__file__).parent / "gaps"
ROOT = Path(__file__).parents[1]
CONFIG = load_config(GAPS / ".shardproof.yml")
EXPECT = {m.name: m.expect for m in CONFIG.models}
SITES = bug_sites([GAPS / "models.py"], ROOT)
CLOSED = {
    "vocab_embedding_int64_ids", "fused_block_reshape", "one_head_per_rank", "fused_block_concat",
    "moe_layer_cut", "vocab_embedding_frontier_noise", "kv_heads_fewer_than_ranks", "one_expert_per_rank",
    "one_head_per_rank_batch1", "kv_heads_grouped_attention", "kv_heads_grouped_attention_batch1",
    "moe_one_expert_per_rank", "fused_block_pad", "dp_batch_rows",
}  # fmt: skip


def _open_gap(name: str) -> list[pytest.MarkDecorator]:
    return [] if name in CLOSED else [pytest.mark.xfail(strict=True, reason=f"open verifier gap: tests/gaps/{name}/README.md")]


def _verify(name: str, partition: bool = True) -> object:
    d = GAPS / name
    return verify(load_relations(d / "relations.yaml"), parse_hlo_file(d / "baseline.hlo"), parse_hlo_file(d / "distributed.hlo"), SourceMap.load(d / "sourcemap.json"), Budget(partition=partition))


def test_every_declared_gap_has_its_pair_and_readme() -> None:
    for name in EXPECT:
        for file in ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json", "README.md"):
            assert (GAPS / name / file).is_file(), f"{name}/{file}"
        assert f"`{name}`" in (GAPS / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_the_oracle_agrees_with_the_expected_verdict(name: str) -> None:
    oracle = pytest.importorskip("oracle")
    d = GAPS / name
    relations = yaml.safe_load((d / "relations.yaml").read_text())
    try:
        equal = [oracle.run_pair((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), relations, seed=s).equal for s in (0, 1)]
    except Exception as e:  # the oracle's own limits are not this test's subject
        pytest.skip(f"the oracle cannot run this pair: {type(e).__name__}: {str(e)[:120]}")
    assert all(equal) == (EXPECT[name] == "verified")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_open_gap(n)) for n in sorted(EXPECT) if EXPECT[n] == "verified"])
def test_the_verifier_proves_the_correct_pair(name: str) -> None:
    assert _verify(name).verdict == "verified"


def test_the_moe_pair_verifies_without_layer_cuts() -> None:
    assert _verify("moe_layer_cut", partition=False).verdict == "verified"


@pytest.mark.parametrize("name", [pytest.param("vocab_embedding_frontier_noise", marks=_open_gap("vocab_embedding_frontier_noise"))])
def test_the_divergence_after_a_vocab_parallel_embedding_is_localized(name: str) -> None:
    result = _verify(name)
    assert result.verdict == "diverged"
    sources = [(d["source"]["file"], d["source"]["line"]) for d in result.divergences]
    assert sources and sources[0] == SITES[name], sources
