"""Every property generator of tests/laws/families.py emits programs XLA would accept: a generator
that draws an ill-typed pair (a slice past its dim, a reshape that changes the element count)
crashes bench/law_properties.py at that draw and hides the family's real draws behind it (found
by review r4: a2adup's slice along the shorter dim, reshapesplit's rows drawn before the batch,
splitscatter's unit block)."""

from __future__ import annotations

import pytest
from laws.families import FAMILIES, generate

from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.shapecheck import check_module
from shardproof.engine.relations import parse_relations


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generator_draws_well_typed_pairs(family: str) -> None:
    bad = []
    for seed in (2911, 5150):
        for p in generate(family, 30, seed):
            try:
                check_module(parse_hlo(p.baseline, "baseline.hlo"))
                check_module(parse_hlo(p.distributed, "distributed.hlo"))
                parse_relations(p.relations, "relations.yaml")
            except Exception as e:  # each refused draw is named with its form
                bad.append(f"seed {seed}: {p.form}: {e}")
    assert not bad, bad[:3]
