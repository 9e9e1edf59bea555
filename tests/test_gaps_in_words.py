"""``unproven`` is never worded as a bug (issue 23, item 3).

Where the rules stop on a correct pair, localization's cause sentence assumed a bug ("puts
elements in a different order than the baseline", "a reduction is missing"). Once the witness
finds the outputs equal, each frontier entry is a rule gap: its cause says the rules could not
relate it and what the witness found; the rules' view is kept as ``rules_saw``, and no fix hint
is given. A confirmed bug keeps its cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.relations import load_relations

BASELINE = """HloModule base

ENTRY %base (p0.1: f32[2,32]) -> (f32[2,32]) {
  %p0.1 = f32[2,32]{1,0} parameter(0)
  %exponential.2 = f32[2,32]{1,0} exponential(f32[2,32]{1,0} %p0.1)
  ROOT %tuple.3 = (f32[2,32]{1,0}) tuple(f32[2,32]{1,0} %exponential.2)
}
"""


def _gathered(order: list[int]) -> str:
    """The list all_gather as the torch.distributed backend once lowered it: a new leading dim,
    all-gather along it, one slice per rank, concatenated along the last dim in ``order``."""
    slices = "".join(
        f"  %slice.{5 + 2 * k} = f32[1,2,8]{{2,1,0}} slice(f32[4,2,8]{{2,1,0}} %all-gather.4), slice={{[{k}:{k + 1}], [0:2], [0:8]}}\n"
        f"  %reshape.{6 + 2 * k} = f32[2,8]{{1,0}} reshape(f32[1,2,8]{{2,1,0}} %slice.{5 + 2 * k})\n"
        for k in range(4)
    )
    parts = ", ".join(f"f32[2,8]{{1,0}} %reshape.{6 + 2 * k}" for k in order)
    return f"""HloModule dist

ENTRY %dist (p0.1: f32[2,8]) -> (f32[2,32]) {{
  %p0.1 = f32[2,8]{{1,0}} parameter(0)
  %exponential.2 = f32[2,8]{{1,0}} exponential(f32[2,8]{{1,0}} %p0.1)
  %reshape.3 = f32[1,2,8]{{2,1,0}} reshape(f32[2,8]{{1,0}} %exponential.2)
  %all-gather.4 = f32[4,2,8]{{2,1,0}} all-gather(f32[1,2,8]{{2,1,0}} %reshape.3), replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}
{slices}  %concatenate.13 = f32[2,32]{{1,0}} concatenate({parts}), dimensions={{1}}
  ROOT %tuple.14 = (f32[2,32]{{1,0}}) tuple(f32[2,32]{{1,0}} %concatenate.13)
}}
"""


RELATIONS = "groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"
BUG_WORDS = ("different order", "missing", "differs from the baseline", "wrong", "redundant", "does not match")


def _check(tmp_path: Path, distributed: str) -> dict:
    (tmp_path / "baseline.hlo").write_text(BASELINE)
    (tmp_path / "distributed.hlo").write_text(distributed)
    (tmp_path / "relations.yaml").write_text(RELATIONS)
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo").to_json()


def test_an_unproven_correct_pair_is_worded_as_a_rule_gap(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    doc = _check(tmp_path, _gathered([0, 1, 2, 3]))
    if doc["verdict"] == "verified":
        pytest.skip("the rules now relate the leading-dim all_gather: this pair is no gap any more")
    assert doc["verdict"] == "unproven" and doc["witness"]["status"] == "equal", doc["reason"]
    (gap,) = doc["divergences"]
    assert gap["kind"] == "rule-gap" and gap["hint"] is None
    assert gap["cause"].startswith("the rules could not relate this reshape to the baseline"), gap["cause"]
    assert "the witness found the outputs equal" in gap["cause"]
    # What localization saw is kept, for whoever extends the rules; nothing of it in the wording.
    assert "different order" in gap["rules_saw"]
    for text in (gap["cause"], doc["reason"]):
        assert not any(w in text for w in BUG_WORDS), text


def test_a_confirmed_bug_keeps_its_cause(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    doc = _check(tmp_path, _gathered([1, 0, 2, 3]))  # two ranks' pieces swapped
    assert doc["verdict"] == "diverged" and doc["witness"]["status"] == "confirmed", doc["reason"]
    first = doc["divergences"][0]
    assert first["kind"] == "divergence" and "rules_saw" not in first
    assert not first["cause"].startswith("the rules could not relate"), first["cause"]
