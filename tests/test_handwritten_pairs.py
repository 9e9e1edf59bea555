"""Small hand-written pairs, one per rule family the torch-xla pairs reach only indirectly; each
verdict is checked against the numeric oracle too."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.verify import Budget, verify
from shardproof.engine.hlo.parser import parse_hlo_file
from shardproof.engine.relations import load_relations

HERE = Path(__file__).parent / "hlo_handwritten"

CASES = [
    # (baseline, distributed, relations, verdict, rule that must appear in the trace)
    ("mlp_baseline", "mlp_distributed", "mlp_relations", "verified", "partition/dot-contract-sharded"),
    ("layout_baseline", "layout_distributed", "layout_relations", "verified", "layout/pointwise-with-fill"),
    ("layout_baseline", "layout_bug_distributed", "layout_relations", "diverged", None),
    ("unroll_baseline", "unroll_distributed", "unroll_relations", "verified", "unroll/loop-reduce-covers-all-blocks"),
    ("unroll_baseline", "unroll_bug_distributed", "unroll_relations", "diverged", None),
    ("kvcache_baseline", "kvcache_distributed", "kvcache_relations", "verified", "partition/concatenate-other-dim"),
    ("kvcache_baseline", "kvcache_bug_distributed", "kvcache_relations", "diverged", None),
    # torch.topk lowers to a two-operand sort with a comparator computation (MoE routers)
    ("topk_baseline", "topk_distributed", "topk_relations", "verified", "partition/dup-binary"),
    ("topk_baseline", "topk_bug_distributed", "topk_relations", "diverged", None),
]


@pytest.mark.parametrize(("base", "dist", "rel", "verdict", "rule"), CASES)
def test_verdict_rule_and_oracle(base: str, dist: str, rel: str, verdict: str, rule: str | None) -> None:
    result = verify(load_relations(HERE / f"{rel}.yaml"), parse_hlo_file(HERE / f"{base}.hlo"), parse_hlo_file(HERE / f"{dist}.hlo"))
    assert result.verdict == verdict
    if rule:
        assert rule in {s["rule"] for t in result.trace for s in t["steps"]}
    else:
        assert result.divergences and result.divergences[0]["instruction"].startswith("%")
    oracle = pytest.importorskip("oracle")
    relations = yaml.safe_load((HERE / f"{rel}.yaml").read_text())
    equal = oracle.run_pair((HERE / f"{base}.hlo").read_text(), (HERE / f"{dist}.hlo").read_text(), relations).equal
    assert equal == (verdict == "verified")


def test_independent_layers_form_one_stage_solved_in_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from shardproof.engine.analysis import verify as verify_module

    threads: set[str] = set()
    solve = verify_module._solve
    both_running = threading.Barrier(2, timeout=20)  # breaks unless two solves overlap in time
    calls = []

    def recording_solve(*args: object, **kwargs: object) -> object:
        calls.append(1)
        threads.add(threading.current_thread().name)
        if len(calls) <= 2:
            both_running.wait()
        return solve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_module, "_solve", recording_solve)
    args = (load_relations(HERE / "branches_relations.yaml"), parse_hlo_file(HERE / "branches_baseline.hlo"), parse_hlo_file(HERE / "branches_distributed.hlo"))
    cut = verify(*args, budget=Budget(workers=2))
    assert cut.verdict == "verified"
    assert (cut.stats["segments"], cut.stats["stages"], cut.stats["segments_proven"]) == (3, 2, 3)
    assert len(threads) == 2  # the two branch layers ran in different worker threads
    assert verify(*args, budget=Budget(partition=False)).verdict == "verified"
