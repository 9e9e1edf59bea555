"""Every torch-xla pair under tests/pairs: the verifier's verdict, the pinpointed source line of
each bug, and agreement with the independent numeric oracle (XLA's own CPU runtime)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.verify import Budget, verify
from shardproof.engine.hlo.parser import parse_hlo_file
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap

PAIRS = Path(__file__).parent / "pairs"
NAMES = sorted(p.name for p in PAIRS.iterdir() if (p / "expect.yaml").exists())


def _load(name: str) -> tuple[dict, object]:
    d = PAIRS / name
    expect = yaml.safe_load((d / "expect.yaml").read_text())
    sm = SourceMap.load(d / "sourcemap.json") if (d / "sourcemap.json").exists() else None
    result = verify(load_relations(d / "relations.yaml"), parse_hlo_file(d / "baseline.hlo"), parse_hlo_file(d / "distributed.hlo"), sm)
    return expect, result


def test_the_pairs_the_issue_names_exist() -> None:
    wanted = {
        "mlp_tp2", "mlp_tp4", "mlp_tp8", "attention_tp4", "fused_qkv_tp4", "vocab_embedding_tp4",
        "sp_norm_tp4", "softmax_sharded_tp4", "layout_bijection_tp4", "bug_missing_allreduce",
        "bug_redundant_allreduce", "bug_wrong_groups", "bug_precision", "bug_axis_split",
        "bug_bsh_layout", "bug_qkv_slice", "bug_constant",
    }  # fmt: skip
    assert wanted <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_verdict_and_bug_site(name: str) -> None:
    expect, result = _load(name)
    assert result.verdict == expect["verdict"], (result.reason, result.divergences[:2])
    if expect["verdict"] == "verified":
        assert result.divergences == []
        assert all(o["ok"] for o in result.outputs)
        return
    site = expect["bug_site"]
    sources = [(d["source"]["file"], d["source"]["line"]) for d in result.divergences]
    assert (site["file"], site["line"]) in sources, (sources, [d["cause"] for d in result.divergences])
    assert all(d["cause"] for d in result.divergences)


@pytest.mark.parametrize("name", NAMES)
def test_numeric_oracle_agrees_with_the_verdict(name: str) -> None:
    oracle = pytest.importorskip("oracle")
    d = PAIRS / name
    expect = yaml.safe_load((d / "expect.yaml").read_text())
    relations = yaml.safe_load((d / "relations.yaml").read_text())
    equal = [oracle.run_pair((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), relations, seed=s).equal for s in (0, 1)]
    if expect["verdict"] == "verified":
        assert all(equal), f"{name}: verified by the rules but the oracle sees a difference"
    else:
        assert not all(equal), f"{name}: a bug pair the oracle cannot tell apart"


def test_layout_pair_reports_the_inferred_bijections() -> None:
    _, result = _load("layout_bijection_tp4")
    ops = [b["ops"] for b in result.bijections]
    # The ranks work on (s·b, h) rows, the baseline on (b·s, h): s=8, b=3, h=48.
    assert ["reshape(8,3,48)", "transpose(1,0,2)", "reshape(24,48)"] in ops
    steps = {s["rule"] for t in result.trace for s in t["steps"]}
    assert {"layout/distributed-step", "layout/dot-rows-relabeled"} <= steps


def test_bsh_bug_names_the_bijection_it_could_not_extend() -> None:
    _, result = _load("bug_bsh_layout")
    (d,) = [d for d in result.divergences if d["opcode"] == "reshape"]
    assert "transpose(1,0,2)" in d["cause"] and "(s·b, h) read as (b, s, h)" in d["cause"]


@pytest.mark.parametrize("name", NAMES)
def test_partitioned_and_whole_graph_agree(name: str) -> None:
    d = PAIRS / name
    args = (load_relations(d / "relations.yaml"), parse_hlo_file(d / "baseline.hlo"), parse_hlo_file(d / "distributed.hlo"), SourceMap.load(d / "sourcemap.json"))
    cut = verify(*args, budget=Budget(partition=True))
    whole = verify(*args, budget=Budget(partition=False))
    assert cut.verdict == whole.verdict
    assert sorted((x["source"]["file"], x["source"]["line"]) for x in cut.divergences) == sorted((x["source"]["file"], x["source"]["line"]) for x in whole.divergences)


def test_layered_pair_is_cut_and_the_repeated_layer_proven_once() -> None:
    _, result = _load("deep_mlp_tp4")
    assert result.verdict == "verified"
    assert result.stats["segments"] == 8
    assert result.stats["segments_proven"] == 2 and result.stats["segments_reused"] == 6


def test_fingerprint_collisions_cannot_reuse_a_wrong_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every segment gets the same fingerprint; the memo must still tell the buggy layer apart.
    from shardproof.engine.analysis import partition

    monkeypatch.setattr(partition, "fingerprint", lambda text: "collide")
    expect, result = _load("bug_deep_mlp_late_layer")
    assert result.verdict == "diverged"
    assert {(d["source"]["file"], d["source"]["line"]) for d in result.divergences} == {(expect["bug_site"]["file"], expect["bug_site"]["line"])}
    assert {s["fingerprint"] for s in result.stats["segment_report"]} == {"collide"}
