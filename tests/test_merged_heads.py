"""Attention with batch and heads merged before a batched matmul (Megatron's [sq, b·np, hn] view
before baddbmm): the merge of a duplicate dim with a sharded one is fused-block sharding
(rules/partition.egg merge-blocks / split-blocks). A hand-written pair, verdicts checked against
XLA's CPU runtime as the numeric oracle; the bug merges the heads before the batch."""

from __future__ import annotations

import pytest

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

# q, k: [s=4, b=2, heads=4, h=8], heads sharded over 2 ranks. Scores per merged (b, head) row,
# scaled by a constant and added to beta · a zero buffer (baddbmm, beta = 0: 0 · buffer is kept,
# as XLA does, since 0 · NaN is NaN), then split back.
BASELINE = """HloModule base
ENTRY %main (q: f32[4,2,4,8], k: f32[4,2,4,8]) -> f32[2,4,4,4] {
  %q = f32[4,2,4,8] parameter(0)
  %k = f32[4,2,4,8] parameter(1)
  %qm = f32[4,8,8] reshape(%q)
  %qt = f32[8,4,8] transpose(%qm), dimensions={1,0,2}
  %km = f32[4,8,8] reshape(%k)
  %kt = f32[8,4,8] transpose(%km), dimensions={1,0,2}
  %s = f32[8,4,4] dot(%qt, %kt), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}
  %a = f32[] constant(0.125)
  %ab = f32[8,4,4] broadcast(%a), dimensions={}
  %sa = f32[8,4,4] multiply(%ab, %s)
  %z = f32[] constant(0)
  %zb = f32[128] broadcast(%z), dimensions={}
  %zr = f32[8,4,4] reshape(%zb)
  %beta = f32[] constant(0)
  %bb = f32[8,4,4] broadcast(%beta), dimensions={}
  %mz = f32[8,4,4] multiply(%bb, %zr)
  %acc = f32[8,4,4] add(%sa, %mz)
  ROOT %out = f32[2,4,4,4] reshape(%acc)
}
"""

DISTRIBUTED = """HloModule dist
ENTRY %main (q: f32[4,2,2,8], k: f32[4,2,2,8]) -> f32[2,2,4,4] {
  %q = f32[4,2,2,8] parameter(0)
  %k = f32[4,2,2,8] parameter(1)
  %qo = f32[4,2,2,8] QORDER
  %ko = f32[4,2,2,8] KORDER
  %qm = f32[4,4,8] reshape(%qo)
  %qt = f32[4,4,8] transpose(%qm), dimensions={1,0,2}
  %km = f32[4,4,8] reshape(%ko)
  %kt = f32[4,4,8] transpose(%km), dimensions={1,0,2}
  %s = f32[4,4,4] dot(%qt, %kt), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}
  %a = f32[] constant(0.125)
  %ab = f32[4,4,4] broadcast(%a), dimensions={}
  %sa = f32[4,4,4] multiply(%ab, %s)
  %z = f32[] constant(0)
  %zb = f32[64] broadcast(%z), dimensions={}
  %zr = f32[4,4,4] reshape(%zb)
  %beta = f32[] constant(0)
  %bb = f32[4,4,4] broadcast(%beta), dimensions={}
  %mz = f32[4,4,4] multiply(%bb, %zr)
  %acc = f32[4,4,4] add(%sa, %mz)
  ROOT %out = f32[2,2,4,4] reshape(%acc)
}
"""

# Correct: merge (b, local heads) as they lie. Bug: heads and batch swapped before the merge, so
# merged row i is (head, b) while the final split reads it as (b, head).
CORRECT = {"QORDER": "copy(%q)", "KORDER": "copy(%k)"}
SWAPPED = {"QORDER": "transpose(%q), dimensions={0,2,1,3}", "KORDER": "transpose(%k), dimensions={0,2,1,3}"}

RELATIONS = {
    "groups": [[0, 1]],
    "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 2},
        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 2},
    ],
    "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}],
}


def _distributed(order: dict[str, str]) -> str:
    text = DISTRIBUTED
    for k, v in order.items():
        text = text.replace(k, v)
    return text


@pytest.mark.parametrize(("order", "verdict"), [(CORRECT, "verified"), (SWAPPED, "diverged")], ids=["correct", "heads-batch-swapped"])
def test_merged_heads_verdict_and_oracle(order: dict[str, str], verdict: str) -> None:
    dist = _distributed(order)
    result = verify(parse_relations(RELATIONS), parse_hlo(BASELINE), parse_hlo(dist))
    assert result.verdict == verdict
    rules = {s["rule"] for t in result.trace for s in t["steps"]}
    if verdict == "verified":
        # (%acc also needs layout.egg's fill rules: beta · buffer is sharded with the blocks only
        # through them; the trace names one derivation per tensor.)
        assert {"partition/merge-dims-into-fused-blocks", "partition/split-fused-blocks-into-dims"} <= rules
    else:
        assert result.divergences and result.divergences[0]["instruction"].startswith("%")
    oracle = pytest.importorskip("oracle")
    assert oracle.run_pair(BASELINE, dist, RELATIONS).equal == (verdict == "verified")
