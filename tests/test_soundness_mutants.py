"""Single-point mutants of verified torch-xla pairs: whatever the oracle finds different must never
be verified. A hand-picked sample here (each mutant changes the value, which the oracle
confirms); the random campaign of 10,000 mutants is a later benchmark."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

PAIRS = Path(__file__).parent / "pairs"

# (pair, regex on the distributed HLO, replacement): each changes one value-relevant thing.
MUTANTS = [
    ("vocab_embedding_tp4", r"s64\[\] constant\(32\)", "s64[] constant(33)"),  # upper bound of the rank's rows
    ("vocab_embedding_tp4", r"direction=LT", "direction=LE"),  # lower bound off by one
    ("vocab_embedding_tp4", r"s32\[\] constant\(32\)", "s32[] constant(31)"),  # rank offset stride
    ("vocab_embedding_tp4", r"replica_groups=\{\{0,1,2,3\}\}", "replica_groups={{0,1},{2,3}}"),
    ("softmax_sharded_tp4", r"to_apply=%MaxComputation\.11", "to_apply=%AddComputation.30"),  # max all-reduce summed
    ("softmax_sharded_tp4", r"f32\[\] constant\(0\)", "f32[] constant(1)"),  # sum init no longer neutral
    ("sp_norm_tp4", r"rsqrt\(", "sqrt("),  # norm divides instead of multiplying
    ("attention_tp4", r"f32\[\] constant\(0.5\)", "f32[] constant(0.25)"),  # attention scale
    ("mlp_tp4", r"erf\(", "tanh("),  # activation changed on the distributed side
    ("fused_qkv_tp4", r"slice=\{\[0:8\], \[0:16\]\}", "slice={[0:8], [16:32]}"),
]


def _mutate(text: str, pattern: str, repl: str) -> str | None:
    new, n = re.subn(pattern, repl, text, count=1)
    return new if n else None


def _run(name: str, pattern: str, repl: str) -> tuple[str, bool] | None:
    """(verdict, oracle-differs) for one mutant, or None when the pattern is absent."""
    d = PAIRS / name
    mutant = _mutate((d / "distributed.hlo").read_text(), pattern, repl)
    if mutant is None:
        return None
    relations = yaml.safe_load((d / "relations.yaml").read_text())
    baseline = (d / "baseline.hlo").read_text()
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline), parse_hlo(mutant, "mutant.hlo"))
    oracle = pytest.importorskip("oracle")
    differs = not all(oracle.run_pair(baseline, mutant, relations, seed=s).equal for s in (0, 1, 2))
    return result.verdict, differs


@pytest.mark.parametrize(("name", "pattern", "repl"), MUTANTS)
def test_semantic_mutant_is_never_verified(name: str, pattern: str, repl: str) -> None:
    # Every mutant changes the program's value for some input (a bound off by one only shows for
    # ids on the boundary), so none may be verified, whatever random inputs happen to show.
    got = _run(name, pattern, repl)
    if got is None:
        pytest.fail(f"pattern {pattern!r} no longer occurs in {name}: update the mutant list")
    verdict, _ = got
    assert verdict in ("diverged", "unsupported", "inconclusive")


def test_the_oracle_sees_most_mutants() -> None:
    # The oracle is independent evidence that the mutants are real changes.
    seen = [got[1] for m in MUTANTS if (got := _run(*m)) is not None]
    assert sum(seen) >= 7, f"the oracle told only {sum(seen)} of {len(seen)} mutants apart"
