"""``unproven`` is never worded as a bug, and a bug past a rule gap is reported where the
values differ (issue 23, item 3).

Where the rules stop on a correct pair, localization's cause sentence assumed a bug ("puts
elements in a different order than the baseline", "a reduction is missing"). Once the witness
finds the outputs equal, each frontier entry is a rule gap: its cause says the rules could not
relate it and what the witness found; the rules' view is kept as ``rules_saw``, and no fix hint
is given. A confirmed bug keeps its cause.

Past a gap: the rules stop at the gap on the correct twin and on its bug twin alike (nothing
past it is related), so the bug twin was reported at the gap's line too. When the gap's values
hold numerically, the witness now probes the instructions past it and the first whose values
differ is the reported line.
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


def test_the_list_all_gather_in_rank_order_is_verified(tmp_path: Path) -> None:
    # This pair was the rule gap of the test below until rules/labelmove.egg followed the
    # gathered pieces per rank: it must stay verified (and its swapped twin stay diverged).
    pytest.importorskip("numpy")
    doc = _check(tmp_path, _gathered([0, 1, 2, 3]))
    assert doc["verdict"] == "verified", doc["reason"]


def test_an_unproven_correct_pair_is_worded_as_a_rule_gap(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    # A slice of length 1 taken with stride 2 reads the same element as stride 1; no rule
    # relates the two spellings, and the witness finds the outputs equal.
    doc = _check_unit(tmp_path / "gap", _unit(2))
    assert doc["verdict"] == "unproven" and doc["witness"]["status"] == "equal", doc["reason"]
    (gap,) = doc["divergences"]
    assert gap["kind"] == "rule-gap" and gap["hint"] is None
    assert gap["cause"].startswith("the rules could not relate this slice to the baseline"), gap["cause"]
    assert "the witness found the outputs equal" in gap["cause"]
    # What localization saw is kept, for whoever extends the rules; nothing of it in the wording.
    assert gap["rules_saw"]
    for text in (gap["cause"], doc["reason"]):
        assert not any(w in text for w in BUG_WORDS), text


def test_a_confirmed_bug_keeps_its_cause(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    doc = _check(tmp_path, _gathered([1, 0, 2, 3]))  # two ranks' pieces swapped
    assert doc["verdict"] == "diverged" and doc["witness"]["status"] == "confirmed", doc["reason"]
    first = doc["divergences"][0]
    assert first["kind"] == "divergence" and "rules_saw" not in first
    assert not first["cause"].startswith("the rules could not relate"), first["cause"]


# A rule gap whose values are equal: a slice of length 1 taken with stride 2 (the same element
# as stride 1; no rule relates the two spellings), then exp, a multiply by a constant and tanh.
_UNIT_SLICE = """HloModule m
ENTRY e {
  a = f32[6,4]{1,0} parameter(0)
  s = f32[6,1]{1,0} slice(a), slice={[0:6:1], [3:4:STRIDE]}
  e = f32[6,1]{1,0} exponential(s)
  k = f32[] constant(SCALE)
  kb = f32[6,1]{1,0} broadcast(k), dimensions={}
  m = f32[6,1]{1,0} multiply(e, kb)
  ROOT y = f32[6,1]{1,0} LAST(m)
}
"""
UNIT_RELATIONS = "groups: [[0, 1]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"


def _unit(stride: int, scale: str = "2", last: str = "tanh") -> str:
    return _UNIT_SLICE.replace("STRIDE", str(stride)).replace("SCALE", scale).replace("LAST", last)


def _check_unit(folder: Path, distributed: str) -> dict:
    folder.mkdir()
    (folder / "baseline.hlo").write_text(_unit(1))
    (folder / "distributed.hlo").write_text(distributed)
    (folder / "relations.yaml").write_text(UNIT_RELATIONS)
    return check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo").to_json()


def _line(text: str, name: str) -> int:
    return 1 + next(i for i, x in enumerate(text.splitlines()) if x.lstrip().startswith((f"{name} =", f"ROOT {name} =")))


@pytest.mark.parametrize(("scale", "last", "bug"), [("3", "tanh", "m"), ("2", "logistic", "y")])
def test_a_bug_past_a_gap_is_reported_where_values_differ(tmp_path: Path, scale: str, last: str, bug: str) -> None:
    pytest.importorskip("numpy")
    # The correct twin: unproven, stopped at the gap (line L), whose values hold.
    correct = _check_unit(tmp_path / "correct", _unit(2))
    assert correct["verdict"] == "unproven" and correct["witness"]["status"] == "equal", correct["reason"]
    (gap,) = correct["divergences"]
    assert gap["instruction"] == "%s" and gap["hlo_line"] == _line(_unit(2), "s")
    # The bug twin: diverged, confirmed, reported at the bug's line, not at L.
    text = _unit(2, scale, last)
    buggy = _check_unit(tmp_path / "bug", text)
    assert buggy["verdict"] == "diverged" and buggy["witness"]["status"] == "confirmed", buggy["reason"]
    first = buggy["divergences"][0]
    assert first["instruction"] == f"%{bug}" and first["hlo_line"] == _line(text, bug) != gap["hlo_line"], first
    assert first["kind"] == "divergence" and first["numeric"]["holds"] is False and first["past_gap"] == "%s"
    assert "the first instruction past the rule gap at %s" in first["cause"]
    # The gap itself is worded as what it is: its values equal, the difference past it.
    (rest,) = buggy["divergences"][1:]
    assert rest["instruction"] == "%s" and rest["kind"] == "rule-gap" and rest["numeric"]["holds"] is True
    assert rest["cause"].startswith("the rules could not relate this slice") and not any(w in rest["cause"] for w in BUG_WORDS), rest["cause"]
