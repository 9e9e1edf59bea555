"""Per-family property tests of the laws (issue 23, item 1): small programs drawn in each
family's forms (tests/laws/families.py: random element types with narrow and unsigned ints,
random sizes, random groups including 2 x 2 data x tensor meshes, drawn offsets, fills, ranges
and replica groups) are checked by the verifier and executed in XLA (tests/oracle.py). No pair
whose outputs XLA finds different may be `verified`. The draws must be meaningful: each family
yields pairs the rules verify and pairs that really differ. ``bench/law_properties.py`` runs the
same generators with many more programs and prints the verdict counts."""

from __future__ import annotations

import pytest
from laws.families import FAMILIES, generate
from laws.run import judge, tally

COUNT = 24
COUNTS = {"window": 12}  # its pairs take ~1 s each to verify (the cumsum laws saturate longer)
SEED = 20261128


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_pair_that_differs_is_verified(family: str) -> None:
    pytest.importorskip("jax")
    count = COUNTS.get(family, COUNT)
    judged = [judge(p) for p in generate(family, count, SEED)]
    counts = tally(judged)
    print(family, dict(sorted(counts.items())))
    bad = [j for j in judged if j.unsound]
    assert not bad, "\n".join(f"{j.program.form}: {j.detail}\n--- baseline\n{j.program.baseline}--- distributed\n{j.program.distributed}" for j in bad)
    # Meaningful draws: the law is exercised (some pairs verify) and so are its side conditions
    # (some pairs really differ, and the runtime executes nearly all of them).
    assert sum(v for k, v in counts.items() if k.startswith("verified/")) >= 2, counts
    assert sum(v for k, v in counts.items() if k.endswith("/differs")) >= 2, counts
    assert sum(v for k, v in counts.items() if k.endswith("/error")) <= count // 6, [j.detail for j in judged if j.equal is None]
