"""The vocab-parallel argmax law (rules/argreduce.egg) on the torch-xla pairs greedy_argmax_tp4
(all-reduce(min) of the candidates) and greedy_argmax_gather_tp4 (all-gather, then amin on int64
from int64 max): single-point mutants of each part the law depends on are never verified, and the
oracle (XLA's CPU runtime) confirms that those changing the value do change it. The comparator
is recognized by its exact body: variants of it keep the reduce unsupported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

PAIRS = Path(__file__).parent / "pairs"

# (pair, regex on the distributed HLO, replacement, the oracle sees a difference on random inputs)
MUTANTS = [
    ("greedy_argmax_tp4", r"s32\[\] constant\(32\)", "s32[] constant(31)", True),  # rank offset stride
    ("greedy_argmax_tp4", r"s64\[\] constant\(9223372036854775807\)", "s64[] constant(100)", True),  # fill below V - 1
    ("greedy_argmax_tp4", r"(compare\(f32\[8\]\{0\} %reduce\.\d+, f32\[8\]\{0\} %all-reduce\.\d+\)), direction=EQ", r"\1, direction=NE", True),
    ("greedy_argmax_tp4", r"minimum\(s64\[\]", "maximum(s64[]", True),  # the all-reduce takes the max over ranks
    ("greedy_argmax_tp4", r"(%compare\.\d+ = pred\[\] compare\(f32\[\] %lhs_value\.\d+, f32\[\] %rhs_value\.\d+\)), direction=GE", r"\1, direction=LE", True),  # local argmin
    ("greedy_argmax_tp4", r"replica_groups=\{\{0,1,2,3\}\}", "replica_groups={{0,1},{2,3}}", True),
    ("greedy_argmax_tp4", r"s32\[\] constant\(0\)", "s32[] constant(1)", False),  # init index: only all -inf rows differ
    ("greedy_argmax_gather_tp4", r"(s64\[\] constant\()9223372036854775807(\).*\n.*reduce\(s64\[8,4\])", r"\g<1>5\2", True),  # amin init
    ("greedy_argmax_gather_tp4", r"minimum\(s64\[\]", "maximum(s64[]", True),  # amax over the gathered candidates
]


def _pair(name: str) -> tuple[str, str, dict]:
    d = PAIRS / name
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


def _verdict(baseline: str, distributed: str, relations: dict) -> str:
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "mutant.hlo"))
    return result.verdict


@pytest.mark.parametrize(("name", "pattern", "repl", "differs"), MUTANTS)
def test_argmax_mutant_is_never_verified(name: str, pattern: str, repl: str, differs: bool) -> None:
    baseline, distributed, relations = _pair(name)
    mutant, n = re.subn(pattern, repl, distributed)
    assert n >= 1, f"pattern {pattern!r} no longer occurs in {name}"
    assert _verdict(baseline, mutant, relations) != "verified"
    if differs:
        oracle = pytest.importorskip("oracle")
        assert not all(oracle.run_pair(baseline, mutant, relations, seed=s).equal for s in (0, 1, 2))


@pytest.mark.parametrize("name", ["greedy_argmax_tp4", "greedy_argmax_gather_tp4"])
def test_correct_argmax_pairs_verify_with_the_law(name: str) -> None:
    baseline, distributed, relations = _pair(name)
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline), parse_hlo(distributed))
    assert result.verdict == "verified", result.reason
    rules = {s["rule"] for t in result.trace for s in t["steps"]}
    assert any(r.startswith("argreduce/vocab-parallel-argmax") for r in rules), rules


def test_bug_pair_points_at_the_candidate_line() -> None:
    baseline, distributed, relations = _pair("bug_argmax_rank_offset")
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline), parse_hlo(distributed))
    assert result.verdict == "diverged"
    assert any(d["opcode"] == "select" for d in result.divergences), [d["opcode"] for d in result.divergences]


COMPARATOR_VARIANTS = [
    # ties resolved to the highest index: not torch's argmax
    (r"minimum\(s32\[\] %lhs_index\.(\d+), s32\[\] %rhs_index\.(\d+)\)", r"maximum(s32[] %lhs_index.\1, s32[] %rhs_index.\2)"),
    # a total-order compare: -0.0 < 0.0 and NaN ordered, another combine
    (r"direction=GE", "direction=GE, type=TOTALORDER"),
    # the value kept from the other side
    (r"select\(pred\[\] %compare\.(\d+), f32\[\] %lhs_value\.(\d+), f32\[\] %rhs_value\.(\d+)\)", r"select(pred[] %compare.\1, f32[] %rhs_value.\3, f32[] %lhs_value.\2)"),
]


@pytest.mark.parametrize(("pattern", "repl"), COMPARATOR_VARIANTS)
def test_other_comparators_stay_unsupported(pattern: str, repl: str) -> None:
    baseline, distributed, relations = _pair("greedy_argmax_tp4")
    mb, nb = re.subn(pattern, repl, baseline, count=1)
    md, nd = re.subn(pattern, repl, distributed, count=1)
    assert nb == nd == 1
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(mb), parse_hlo(md))
    assert result.verdict == "unsupported", result.reason
    assert "argmax/argmin" in result.reason or any("argmax/argmin" in u["reason"] for u in result.unsupported)


# A row max (an `extof` of argreduce.egg) holds of any tensor; it counts as related for
# localization only where the tensor is sharded along the reduced dim (the vocab-parallel case).
# Here the sum over ranks is missing, so the softmax-like max after it reads a partial sum: only
# the first instruction past the missing all-reduce is reported, not the broadcast of the max
# (the 126-layer stack reported every later layer's softmax broadcast that way).
_SOFTMAX_BASE = """HloModule b
%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}
ENTRY %e (x: f32[4,8], w: f32[8,8]) -> f32[4,8] {
  %x = f32[4,8] parameter(0)
  %w = f32[8,8] parameter(1)
  %h = f32[4,8] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %s = f32[4,8] tanh(%h)
  %ninf = f32[] constant(-inf)
  %rmax = f32[4] reduce(%s, %ninf), dimensions={1}, to_apply=%max
  %bmax = f32[4,8] broadcast(%rmax), dimensions={0}
  ROOT %z = f32[4,8] subtract(%s, %bmax)
}
"""


def test_a_row_max_after_a_divergence_is_not_a_frontier_of_its_own() -> None:
    distributed = _SOFTMAX_BASE.replace("f32[4,8] parameter(0)", "f32[4,4] parameter(0)").replace("(x: f32[4,8], w: f32[8,8])", "(x: f32[4,4], w: f32[4,8])").replace("%w = f32[8,8]", "%w = f32[4,8]")
    relations = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}, {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
                 "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(_SOFTMAX_BASE, "baseline.hlo"), parse_hlo(distributed, "distributed.hlo"))
    assert result.verdict == "diverged"
    assert [d["instruction"] for d in result.divergences] == ["%s"], result.divergences
