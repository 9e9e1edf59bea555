"""rules/expertlist.egg on the hand-written gap "MoE top-1 with local experts" (tests/adversarial:
torch-xla HLO of a loop over the rank's two local experts, each selected by idx == rank*2 + e,
summed and all-reduced): the correct form verifies; with the index off by one, rank r's mask
is the baseline's mask of expert r*2 + e + 1 (related, one rank at a time) and it stays
diverged where that mask multiplies expert r*2 + e's output. The property family (tests/laws/families.py,
``expertlist``) checks both spellings of the law against XLA."""

from __future__ import annotations

from pathlib import Path

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import Budget
from shardproof.engine.relations import load_relations

PAIRS = Path(__file__).parent / "adversarial" / "pairs"


def _check(name: str):  # type: ignore[no-untyped-def]
    folder = PAIRS / name
    return check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo", budget=Budget())


def test_moe_top1_local_experts_verifies() -> None:
    result = _check("c_moe_top1_local_experts")
    assert result.verdict == "verified", result.reason
    rules = {step["rule"] for out in result.trace for step in out["steps"]}
    assert "expertlist/local-experts-summed-cover-every-expert" in rules, rules


def test_moe_expert_index_off_by_one_diverges_where_mask_and_expert_meet() -> None:
    result = _check("b_moe_expert_offset")
    assert result.verdict == "diverged", result.reason
    first = result.divergences[0]
    assert first["opcode"] == "multiply", first
    assert all("one baseline expert's value per rank" in o["relation"] for o in first["operands"]), first["operands"]
