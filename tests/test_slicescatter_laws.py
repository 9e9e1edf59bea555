"""rules/slicescatter.egg against XLA's execution: a partial sum x (4 ranks) cut into blocks along
one dim, the blocks concatenated along another and reduce-scattered there is x sharded along the
first dim only when the blocks are 0..c-1 in order, the partial's op and the reduce-scatter's
are both add, and the reduce-scatter runs over the group in rank order. Each wrong spelling
below differs in execution and must not verify; each right one verifies and executes equal."""

from __future__ import annotations

from typing import Any

import pytest

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

BASE = """HloModule b

ENTRY %main (x: f32[8,4]) -> f32[8,4] {
  ROOT %x = f32[8,4]{1,0} parameter(0)
}
"""

REDUCERS = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}
"""


def _shape(dims: list[int]) -> str:
    return f"f32[{dims[0]},{dims[1]}]{{1,0}}"


def _dist(order: list[int], k: int = 1, cat: int = 0, groups: str = "{{0,1,2,3}}", op: str = "add") -> str:
    """x [8,4] cut into 4 blocks along k, the blocks ``order`` concatenated along ``cat`` and
    reduce-scattered along ``cat``."""
    piece = [8, 1] if k == 1 else [2, 4]
    lines = ["  %x = f32[8,4]{1,0} parameter(0)"]
    names = []
    for i, e in enumerate(order):
        lo, hi = e * piece[k], (e + 1) * piece[k]
        bounds = "[0:8], " + f"[{lo}:{hi}]" if k == 1 else f"[{lo}:{hi}], [0:4]"
        lines.append(f"  %blk{i}_{e} = {_shape(piece)} slice(f32[8,4]{{1,0}} %x), slice={{{bounds}}}")
        names.append(f"{_shape(piece)} %blk{i}_{e}")
    stacked = list(piece)
    stacked[cat] *= len(order)
    out = list(stacked)
    out[cat] //= 4
    lines.append(f"  %c = {_shape(stacked)} concatenate({', '.join(names)}), dimensions={{{cat}}}")
    lines.append(f"  ROOT %rs = {_shape(out)} reduce-scatter({_shape(stacked)} %c), channel_id=1, replica_groups={groups}, use_global_device_ids=true, dimensions={{{cat}}}, to_apply=%{op}")
    return f"HloModule d\n\n{REDUCERS}\nENTRY %main (x: f32[8,4]) -> {_shape(out)} {{\n" + "\n".join(lines) + "\n}\n"


def _relations(out_dim: int, op: str = "add") -> dict[str, Any]:
    return {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "partial", "op": op}],
            "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": out_dim}]}


CASES = {
    # name: (distributed text, relations, the law holds)
    "columns_in_order": (_dist([0, 1, 2, 3]), _relations(1), True),
    "rows_in_order_stacked_on_columns": (_dist([0, 1, 2, 3], k=0, cat=1), _relations(0), True),
    "two_blocks_swapped": (_dist([1, 0, 2, 3]), _relations(1), False),
    "blocks_reversed": (_dist([3, 2, 1, 0]), _relations(1), False),
    "a_block_twice": (_dist([0, 1, 1, 3]), _relations(1), False),
    "rows_swapped": (_dist([0, 2, 1, 3], k=0, cat=1), _relations(0), False),
    "declared_on_the_stacking_dim": (_dist([0, 1, 2, 3]), _relations(0), False),
    "group_not_in_rank_order": (_dist([0, 1, 2, 3], groups="{{1,0,3,2}}"), _relations(1), False),
    "max_scatter_of_a_sum": (_dist([0, 1, 2, 3], op="max"), _relations(1), False),
    "sum_scatter_of_a_max": (_dist([0, 1, 2, 3]), _relations(1, "max"), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_reduce_scatter_verifies_exactly_where_execution_agrees(name: str) -> None:
    oracle = pytest.importorskip("oracle")
    dist, relations, holds = CASES[name]
    equal = [oracle.run_pair(BASE, dist, relations, seed=s).equal for s in (0, 1)]
    assert all(equal) == holds, equal  # the case is what its name says
    verdict = verify(parse_relations(relations), parse_hlo(BASE, "baseline.hlo"), parse_hlo(dist, "distributed.hlo")).verdict
    assert (verdict == "verified") == holds, verdict
