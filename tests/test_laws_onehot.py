"""rules/onehot.egg and scatter.py's overwrite reading on real torch-xla code: ``F.one_hot``
lowers to an overwriting scatter at (iota row, class id); with the rows (tokens) split over 4
ranks the rank's table is the baseline's block (verified), and a rank that permutes its ids
diverges at that line, confirmed by the witness. The laws' property test against XLA execution
is tests/test_law_properties.py (family "onehot"); an overwrite whose indices may collide stays
unsupported (tests/test_scatter.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shardproof.engine.analysis.scatter import read_scatter
from shardproof.engine.frontend.runner import run_models
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo

PROJECT = Path(__file__).parent / "onehot_project" / ".shardproof.yml"

_ONEHOT = """HloModule m

%ow (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  ROOT %b = s32[] parameter(1)
}

ENTRY %main (ids: s32[8]) -> s32[8,4] {
  %ids = s32[8] parameter(0)
  %z = s32[] constant(0)
  %zs = s32[8,4] broadcast(s32[] %z), dimensions={}
  %io = IOTA
  %r = s32[8,1,1] reshape(s32[8] %ids)
  %ix = s32[8,1,2] concatenate(s32[8,1,1] %io, s32[8,1,1] %r), dimensions={2}
  %one = s32[] constant(1)
  %ones = s32[8,1] broadcast(s32[] %one), dimensions={}
  ROOT %s = s32[8,4] scatter(s32[8,4] %zs, s32[8,1,2] %ix, s32[8,1] %ones), update_window_dims={}, inserted_window_dims={0,1}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=2, to_apply=%ow
}
"""


@pytest.mark.parametrize(("iota", "expect"), [
    ("s32[8,1,1] iota(), iota_dimension=0", True),   # one row per update: never collide
    ("s32[8,1,1] iota(), iota_dimension=1", False),  # all zeros: rows collide
    ("s32[8,1,1] iota(), iota_dimension=2", False),
    ("s32[8,1,1] constant({{{0}},{{1}},{{2}},{{3}},{{4}},{{5}},{{6}},{{7}}})", False),  # distinct, but not proven so
])
def test_an_overwrite_is_read_only_when_its_updates_cannot_collide(iota: str, expect: bool) -> None:
    m = normalize(parse_hlo(_ONEHOT.replace("IOTA", iota), "m.hlo"))
    s = m.entry.get("%s") or m.entry.get("s")
    assert s is not None
    shapes = [m.entry.get(o).shape for o in s.operands]  # type: ignore[union-attr]
    form = read_scatter(s, shapes, m)
    assert (not isinstance(form, str) and form.combiner == "overwrite") == expect, form
    assert isinstance(read_scatter(s, shapes), str)  # without the module nothing is proven: never read


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs the frontend extra")
def test_f_one_hot_of_sequence_parallel_tokens_verifies_and_its_twin_diverges_at_its_line(tmp_path: Path) -> None:
    doc = run_models(PROJECT, tmp_path, ["onehot_router_sp4", "bug_onehot_reversed_ids"])
    rows = {r["name"]: r for r in doc["models"]}
    good, bug = rows["onehot_router_sp4"], rows["bug_onehot_reversed_ids"]
    assert "scatter(" in (tmp_path / "onehot_router_sp4" / "distributed.hlo").read_text()
    assert good["status"] == "verified", good.get("result", {}).get("reason")
    assert bug["status"] == "diverged" and bug["result"]["witness"]["status"] == "confirmed", bug.get("result", {}).get("reason")
    first = bug["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == ("tests/onehot_project/onehot_models.py", 25), first
