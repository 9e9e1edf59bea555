"""The pairs' torch functions agree numerically (correct pairs) or disagree (bug pairs)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent / "pairs"))

import check_eager
import models


@pytest.mark.parametrize("name", list(models.PAIRS))
def test_pair_numerics(name: str) -> None:
    outcome = check_eager.check_pair(models.PAIRS[name])
    if outcome.expected == "verified":
        assert outcome.matches, f"{name}: ranks differ from the baseline by {outcome.max_error}"
    else:
        assert not outcome.matches and outcome.max_error > check_eager.BUG_MARGIN, (
            f"{name}: the bug does not change the output (max |diff| {outcome.max_error})"
        )


def test_every_bug_variant_has_one_site() -> None:
    sites: dict[str, list[int]] = {}
    text = Path(models.__file__).read_text().splitlines()
    for number, line in enumerate(text, start=1):
        match = re.search(r"#\s*BUG-SITE:\s*(\w+)\s*$", line)
        if match:
            sites.setdefault(match.group(1), []).append(number)
    bugs = {name for name in models.PAIRS if name.startswith("bug_")}
    assert set(sites) == bugs
    assert all(len(lines) == 1 for lines in sites.values())
