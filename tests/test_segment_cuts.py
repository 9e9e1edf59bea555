"""Segment pairs whose two sides cut at different points (analysis/verify.py, PULL_STEPS), and
the normalizer's unit-dim broadcasts: the forms of megatron-core's GPTModel with RoPE.

torch-xla materializes a view in the scope of its first consumer: the distributed program's
transpose of the all-reduced embedding names layer 0, the baseline's names the embedding. Cut
there, layer 0's baseline reads the transposed value as an opaque parameter that no carried
fact mentions; the segment must compute it again from its operands to meet the rank's
transpose. Each verdict is checked against the numeric oracle."""

from __future__ import annotations

import pytest

from shardproof.engine.analysis import verify as verify_module
from shardproof.engine.analysis.verify import Budget, verify
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

RELATIONS = {
    "groups": [[0, 1]],
    "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "duplicate"},
        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0},
        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 1},
    ],
    "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
}

BASELINE = """HloModule cut_base
ENTRY %main (x: f32[4,8], a1: f32[8,8], a2: f32[8,8]) -> f32[8,4] {
  %x = f32[4,8] parameter(0)
  %a1 = f32[8,8] parameter(1)
  %a2 = f32[8,8] parameter(2)
  %h = f32[4,8] dot(%x, %a1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="model.layers.0/mm"}
  %t = f32[4,8] tanh(%h), metadata={op_name="model.layers.0/tanh"}
  %p = f32[4,8] dot(%t, %a2), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="model.layers.0/mm"}
  %o = f32[8,4] transpose(%p), dimensions={1,0}, metadata={op_name="model.layers.0/permute"}
  ROOT %z = f32[8,4] exponential(%o), metadata={op_name="model.layers.1/exp"}
}
"""

# The rank's transpose of the all-reduced value names layer 1 (where it is first read).
DISTRIBUTED = """HloModule cut_dist
%add (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %r = f32[] add(%p, %q)
}
ENTRY %main (x: f32[4,8], a1: f32[4,8], a2: f32[8,4]) -> f32[8,4] {
  %x = f32[4,8] parameter(0)
  %a1 = f32[4,8] parameter(1)
  %a2 = f32[8,4] parameter(2)
  %h = f32[4,4] dot(%x, %a1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="model.layers.0/mm"}
  %t = f32[4,4] tanh(%h), metadata={op_name="model.layers.0/tanh"}
  %p = f32[4,8] dot(%t, %a2), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="model.layers.0/mm"}
  %o = f32[4,8] all-reduce(%p), replica_groups={{0,1}}, to_apply=%add, metadata={op_name="model.layers.0/all_reduce"}
  %tr = f32[8,4] transpose(%o), dimensions={1,0}, metadata={op_name="model.layers.1/permute"}
  ROOT %z = f32[8,4] exponential(%tr), metadata={op_name="model.layers.1/exp"}
}
"""


def _verify(distributed: str, budget: Budget | None = None) -> verify_module.Result:
    return verify(parse_relations(RELATIONS), parse_hlo(BASELINE), parse_hlo(distributed), budget=budget)


def _oracle_equal(distributed: str) -> bool:
    oracle = pytest.importorskip("oracle")
    return bool(oracle.run_pair(BASELINE, distributed, RELATIONS).equal)


def test_a_value_cut_at_different_points_is_computed_again_in_the_later_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    cut = _verify(DISTRIBUTED)
    assert cut.verdict == "verified", cut.reason
    assert cut.stats["segments"] == 2  # proven cut, not by the whole-graph rerun of check_files
    assert _oracle_equal(DISTRIBUTED)
    # Without computing the baseline's transpose again, the fact about the all-reduce (a
    # duplicate of the untransposed %p) has nothing to attach to in layer 1: the cut loses it.
    monkeypatch.setattr(verify_module, "PULL_STEPS", 0)
    assert _verify(DISTRIBUTED).verdict != "verified"


def test_a_bug_behind_the_cut_still_diverges() -> None:
    # The all-reduce forgotten: the value computed again is a partial sum, never a duplicate.
    missing = DISTRIBUTED.replace("%o = f32[4,8] all-reduce(%p), replica_groups={{0,1}}, to_apply=%add", "%o = f32[4,8] negate(%p)")
    result = _verify(missing)
    assert result.verdict == "diverged", result.reason
    assert not _oracle_equal(missing)
    # A wrong transpose on the rank after the cut: the pulled baseline transpose does not meet it.
    wrong = DISTRIBUTED.replace("%tr = f32[8,4] transpose(%o), dimensions={1,0}", "%tr = f32[8,4] reshape(%o)")
    assert _verify(wrong).verdict == "diverged"
    assert not _oracle_equal(wrong)


UNIT_DIMS = """HloModule rope
ENTRY %main (f: f32[8,1,1,4], q: f32[8,2,1,4]) -> f32[8,2,1,4] {
  %f = f32[8,1,1,4] parameter(0)
  %q = f32[8,2,1,4] parameter(1)
  %v = f32[8,1,4] reshape(%f)
  %b = f32[8,2,1,4] broadcast(%v), dimensions={0,2,3}
  ROOT %m = f32[8,2,1,4] multiply(%q, %b)
}
"""


def test_a_broadcast_of_a_reshape_that_moves_unit_dims_reads_the_squeezed_value() -> None:
    # RoPE's [s, 1, 1, d] frequencies viewed as [s, 1, d] on a rank with one head and as [s, d]
    # in the baseline: both become broadcast(reshape(f) to [s, d]).
    entry = normalize(parse_hlo(UNIT_DIMS)).entry
    b = next(i for i in entry.instructions if i.opcode == "broadcast")
    (squeezed,) = (entry[o] for o in b.operands)
    assert (squeezed.opcode, squeezed.shape.dims, squeezed.operands) == ("reshape", (8, 4), ["f"])
    assert b.parsed["dimensions"] == [0, 3]
    assert squeezed.origin == "v"  # reported at the reshape it was made from
