"""torch-xla SPMD front end: an output's expected relation is derived from the baseline's
output shape, which is already one group's (the baseline runs on one group's part of the
batch). A dim split over a data-parallel axis must not be divided again."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from shardproof.engine.frontend.jax.build import SpecError
from shardproof.engine.frontend.spmd.build import output_relations


def _mesh(**axes: int) -> SimpleNamespace:
    names = tuple(axes)
    return SimpleNamespace(axis_names=names, shape=dict(axes), devices=np.zeros(tuple(axes.values())))


def test_dp_split_output_of_one_row_per_group_is_not_divided_again() -> None:
    # DP 2 x TP 2, a global batch of 2: the baseline's output has 1 row (one group's). Dividing
    # that row by the dp axis again refused this correct model ("does not divide").
    mesh = _mesh(dp=2, tp=2)
    outs = output_relations([("dp", "tp"), ("dp",), ()], [(1, 8), (1, 3), (5,)], mesh, ("tp",), "m")
    assert outs == [
        {"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1},
        {"baseline": 1, "distributed": 1, "relation": "duplicate"},
        {"baseline": 2, "distributed": 2, "relation": "duplicate"},
    ]


def test_group_split_output_must_still_divide() -> None:
    # The group axis still shards the baseline's dim: a dim the group cannot split is refused.
    mesh = _mesh(dp=2, tp=2)
    with pytest.raises(SpecError, match=r"output 0: dim 1 of \(1, 3\) does not divide over axis tp \(2\)"):
        output_relations([("dp", "tp")], [(1, 3)], mesh, ("tp",), "m")
