"""``unproven`` is never worded as a bug, and a bug past a rule gap is reported where the
values differ (issue 23, item 3).

Where the rules stop on a correct pair, localization's cause sentence assumed a bug ("puts
elements in a different order than the baseline", "a reduction is missing"). Once the witness
finds the outputs equal, each frontier entry is a rule gap: its cause says the rules could not
relate it and what the witness found; the rules' view is kept as ``rules_saw``, and no fix hint
is given. A confirmed bug keeps its cause.

Past a gap: the rules stop at the gap on the correct twin and on its bug twin alike (nothing
past it is related), so the bug twin was reported at the gap's line too. The witness now probes
the instructions past the gap and the first whose values differ is the reported line.
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


def _gathered(order: list[int], scale: str | None = None) -> str:
    """The list all_gather as the torch.distributed backend once lowered it: a new leading dim,
    all-gather along it, one slice per rank, concatenated along the last dim in ``order``; with
    ``scale``, then tanh and a multiply by that constant (the baseline's is 2)."""
    slices = "".join(
        f"  %slice.{5 + 2 * k} = f32[1,2,8]{{2,1,0}} slice(f32[4,2,8]{{2,1,0}} %all-gather.4), slice={{[{k}:{k + 1}], [0:2], [0:8]}}\n"
        f"  %reshape.{6 + 2 * k} = f32[2,8]{{1,0}} reshape(f32[1,2,8]{{2,1,0}} %slice.{5 + 2 * k})\n"
        for k in range(4)
    )
    parts = ", ".join(f"f32[2,8]{{1,0}} %reshape.{6 + 2 * k}" for k in order)
    out = "%concatenate.13"
    tail = ""
    if scale is not None:
        tail = (f"  %tanh.15 = f32[2,32]{{1,0}} tanh(f32[2,32]{{1,0}} %concatenate.13)\n  %constant.16 = f32[] constant({scale})\n"
                "  %broadcast.17 = f32[2,32]{1,0} broadcast(f32[] %constant.16), dimensions={}\n"
                "  %multiply.18 = f32[2,32]{1,0} multiply(f32[2,32]{1,0} %tanh.15, f32[2,32]{1,0} %broadcast.17)\n")
        out = "%multiply.18"
    return f"""HloModule dist

ENTRY %dist (p0.1: f32[2,8]) -> (f32[2,32]) {{
  %p0.1 = f32[2,8]{{1,0}} parameter(0)
  %exponential.2 = f32[2,8]{{1,0}} exponential(f32[2,8]{{1,0}} %p0.1)
  %reshape.3 = f32[1,2,8]{{2,1,0}} reshape(f32[2,8]{{1,0}} %exponential.2)
  %all-gather.4 = f32[4,2,8]{{2,1,0}} all-gather(f32[1,2,8]{{2,1,0}} %reshape.3), replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}
{slices}  %concatenate.13 = f32[2,32]{{1,0}} concatenate({parts}), dimensions={{1}}
{tail}  ROOT %tuple.14 = (f32[2,32]{{1,0}}) tuple(f32[2,32]{{1,0}} {out})
}}
"""


RELATIONS = "groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"
BUG_WORDS = ("different order", "missing", "differs from the baseline", "wrong", "redundant", "does not match")


SCALED = """HloModule base

ENTRY %base (p0.1: f32[2,32]) -> (f32[2,32]) {
  %p0.1 = f32[2,32]{1,0} parameter(0)
  %exponential.2 = f32[2,32]{1,0} exponential(f32[2,32]{1,0} %p0.1)
  %tanh.3 = f32[2,32]{1,0} tanh(f32[2,32]{1,0} %exponential.2)
  %constant.4 = f32[] constant(2)
  %broadcast.5 = f32[2,32]{1,0} broadcast(f32[] %constant.4), dimensions={}
  %multiply.6 = f32[2,32]{1,0} multiply(f32[2,32]{1,0} %tanh.3, f32[2,32]{1,0} %broadcast.5)
  ROOT %tuple.7 = (f32[2,32]{1,0}) tuple(f32[2,32]{1,0} %multiply.6)
}
"""


def _check(tmp_path: Path, distributed: str, baseline: str = BASELINE) -> dict:
    (tmp_path / "baseline.hlo").write_text(baseline)
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


def _line(text: str, name: str) -> int:
    return 1 + next(i for i, x in enumerate(text.splitlines()) if x.lstrip().startswith(f"%{name} ") or x.lstrip().startswith(f"ROOT %{name} "))


@pytest.mark.parametrize(
    ("order", "scale", "baseline", "bug"),
    [
        ([1, 0, 2, 3], None, BASELINE, "concatenate.13"),  # the pieces joined in a wrong order
        ([0, 1, 2, 3], "3", SCALED, "multiply.18"),  # a wrong constant two instructions later
    ],
)
def test_a_bug_past_a_gap_is_reported_where_values_differ(tmp_path: Path, order: list[int], scale: str | None, baseline: str, bug: str) -> None:
    pytest.importorskip("numpy")
    correct_text = _gathered([0, 1, 2, 3], "2" if scale else None)
    (tmp_path / "correct").mkdir()
    correct = _check(tmp_path / "correct", correct_text, baseline)
    if correct["verdict"] == "verified":
        pytest.skip("the rules now relate the leading-dim all_gather: no gap to stop at")
    # The correct twin: unproven, stopped at the gap (line L).
    assert correct["verdict"] == "unproven" and correct["witness"]["status"] == "equal", correct["reason"]
    gap_line = correct["divergences"][0]["hlo_line"]
    assert correct["divergences"][0]["instruction"] == "%reshape.3"
    # The bug twin: diverged, confirmed, reported at the bug's line, not at L.
    text = _gathered(order, scale)
    buggy = _check(tmp_path, text, baseline)
    assert buggy["verdict"] == "diverged" and buggy["witness"]["status"] == "confirmed", buggy["reason"]
    first = buggy["divergences"][0]
    assert first["instruction"] == f"%{bug}" and first["hlo_line"] == _line(text, bug) != gap_line, first
    assert first["kind"] == "divergence" and first["numeric"]["holds"] is False and first["past_gap"] == "%reshape.3"
    # The gap itself is worded as what it is.
    rest = buggy["divergences"][1:]
    assert rest and all(d["kind"] == "rule-gap" and d["cause"].startswith("the rules could not relate") for d in rest)
