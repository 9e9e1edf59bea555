"""The rankint law family (engine/analysis/laws/rankint.py, rules/rankint.egg): rank-dependent
integer and boolean tensors evaluated exactly per rank and related blockwise to the baseline.

- a causal mask whose per-rank rows are spelled ``(iota + r*4) % 16`` (no rule of the other
  families follows the remainder) is verified with the family and unproven without it; its bug
  twin (a strict compare) is diverged at the compare;
- property test: the per-rank values the evaluator computes equal what XLA's CPU runtime
  computes on every rank, for narrow and unsigned types (wrap), truncating divide/remainder of
  negatives, shifts, clamps, selects and converts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from shardproof.engine.analysis import laws
from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.graph import build
from shardproof.engine.analysis.laws import rankint
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import load_relations

BASE = """HloModule causal_base

ENTRY main {
  s = f32[16,16]{1,0} parameter(0)
  row = s32[16,16]{1,0} iota(), iota_dimension=0
  col = s32[16,16]{1,0} iota(), iota_dimension=1
  m = pred[16,16]{1,0} compare(row, col), direction=GE
  ninf = f32[] constant(-inf)
  nb = f32[16,16]{1,0} broadcast(ninf), dimensions={}
  ROOT o = f32[16,16]{1,0} select(m, s, nb)
}
"""

DIST = """HloModule causal_dist

ENTRY main {
  s = f32[4,16]{1,0} parameter(0)
  rank = s32[] parameter(1)
  four = s32[] constant(4)
  off = s32[] multiply(rank, four)
  offb = s32[4,16]{1,0} broadcast(off), dimensions={}
  i = s32[4,16]{1,0} iota(), iota_dimension=0
  pos = s32[4,16]{1,0} add(i, offb)
  sixteen = s32[] constant(16)
  sb = s32[4,16]{1,0} broadcast(sixteen), dimensions={}
  row = s32[4,16]{1,0} remainder(pos, sb)
  col = s32[4,16]{1,0} iota(), iota_dimension=1
  m = pred[4,16]{1,0} compare(row, col), direction=GE
  ninf = f32[] constant(-inf)
  nb = f32[4,16]{1,0} broadcast(ninf), dimensions={}
  ROOT o = f32[4,16]{1,0} select(m, s, nb)
}
"""

RELATIONS = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
  - {distributed: rank, relation: rank}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
"""


def _check(tmp_path: Path, dist: str) -> Any:
    (tmp_path / "b.hlo").write_text(BASE)
    (tmp_path / "d.hlo").write_text(dist)
    (tmp_path / "r.yaml").write_text(RELATIONS)
    return check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo")


def test_causal_mask_mod_spelling_verified_only_with_the_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _check(tmp_path, DIST).verdict == "verified"
    monkeypatch.setattr(laws, "FAMILIES", [f for f in laws.FAMILIES if f.name != "rankint"])
    monkeypatch.setattr("shardproof.engine.analysis.graph.FAMILIES", laws.FAMILIES)
    assert _check(tmp_path, DIST).verdict == "unproven"


def test_causal_mask_bug_twin_diverged_at_the_compare(tmp_path: Path) -> None:
    res = _check(tmp_path, DIST.replace("direction=GE", "direction=GT"))
    assert res.verdict == "diverged"
    assert res.witness and res.witness.get("confirmed", True)
    assert res.divergences[0]["instruction"] == "%m"


def test_rows_only_for_values_equal_on_every_rank() -> None:
    """An offset off by one block on the last rank only: no sharded row for it (each rank is
    checked, not an extrapolation from the first)."""
    spec = load_relations_text(RELATIONS)
    bad = DIST.replace("  pos = s32[4,16]{1,0} add(i, offb)\n", "  three = s32[] constant(3)\n  last = pred[] compare(rank, three), direction=EQ\n  one = s32[] constant(1)\n  zero = s32[] constant(0)\n  bump = s32[] select(last, one, zero)\n  bb = s32[4,16]{1,0} broadcast(bump), dimensions={}\n  p0 = s32[4,16]{1,0} add(i, offb)\n  pos = s32[4,16]{1,0} add(p0, bb)\n")
    g = build(spec, parse_hlo(BASE), parse_hlo(bad), {"rank"})
    names = {g.nodes[d].ins.name for _b, d, _e in g.rows["rkshard"]}
    assert "p0" in names and "pos" not in names and "row" not in names and "m" not in names
    good = build(spec, parse_hlo(BASE), parse_hlo(DIST), {"rank"})
    assert {"pos", "row", "m"} <= {good.nodes[d].ins.name for _b, d, _e in good.rows["rkshard"]}


def test_rank_scalar_through_a_narrowing_convert() -> None:
    """convert(r·w) to a narrower int type (JAX narrows the vocab offset to the ids' type) is
    evaluated per rank: r·30 in s8 is affine (0, 30, 60, 90), r·50 wraps on rank 3 (150 is -106
    in s8) and gets no affine fact; a widening convert is left to the rules (rules/slicing.egg)."""
    spec = load_relations_text("groups: [[0, 1, 2, 3]]\ninputs:\n  - {distributed: 0, relation: rank}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n")
    base = parse_hlo("HloModule b\n\nENTRY main {\n  ROOT z = s8[] constant(0)\n}\n")

    def rows(w: int, to: str) -> list[tuple[object, ...]]:
        text = f"HloModule d\n\nENTRY main {{\n  r = s32[] parameter(0)\n  w = s32[] constant({w})\n  m = s32[] multiply(r, w)\n  ROOT v = {to}[] convert(m)\n}}\n"
        g = build(spec, base, parse_hlo(text), {"r"})
        v = g.by_name[("distributed", "v")]
        return [row[1:] for row in g.rows["rkaff"] if row[0] == v]

    assert rows(30, "s8") == [(30, 0)]
    assert rows(50, "s8") == []
    assert rows(30, "s64") == []  # widening: affine-widen (rules/slicing.egg) follows it


def load_relations_text(text: str) -> Any:
    from shardproof.engine.relations import parse_relations

    return parse_relations(yaml.safe_load(text))


# ---- property test against XLA's execution: every expression, every rank, exact.

EXPRS = [
    # (dtype, body lines computing %v from %r (the rank, s32[]) and %i (an iota of the type))
    ("s8", "  k = s8[] constant(100)\n  rb = s8[] convert(r)\n  km = s8[] multiply(k, rb)\n  kb = s8[64]{0} broadcast(km), dimensions={}\n  ROOT v = s8[64]{0} add(i, kb)"),
    ("u8", "  rb = u8[] convert(r)\n  k = u8[] constant(77)\n  km = u8[] multiply(rb, k)\n  kb = u8[64]{0} broadcast(km), dimensions={}\n  ROOT v = u8[64]{0} subtract(i, kb)"),
    ("s32", "  k = s32[] constant(-7)\n  rb = s32[] multiply(r, k)\n  kb = s32[64]{0} broadcast(rb), dimensions={}\n  x = s32[64]{0} add(i, kb)\n  d = s32[] constant(-5)\n  db = s32[64]{0} broadcast(d), dimensions={}\n  q = s32[64]{0} divide(x, db)\n  m = s32[64]{0} remainder(x, db)\n  ROOT v = s32[64]{0} add(q, m)"),
    ("s16", "  rb = s16[] convert(r)\n  k = s16[] constant(13)\n  kb = s16[64]{0} broadcast(k), dimensions={}\n  sh = s16[64]{0} shift-left(i, kb)\n  rr = s16[64]{0} broadcast(rb), dimensions={}\n  ROOT v = s16[64]{0} shift-right-arithmetic(sh, rr)"),
    ("u16", "  rb = u16[] convert(r)\n  rr = u16[64]{0} broadcast(rb), dimensions={}\n  k = u16[] constant(15)\n  kb = u16[64]{0} broadcast(k), dimensions={}\n  sh = u16[64]{0} shift-left(i, kb)\n  ROOT v = u16[64]{0} shift-right-logical(sh, rr)"),
    ("s32", "  c4 = s32[] constant(4)\n  x = s32[] subtract(r, c4)\n  xb = s32[64]{0} broadcast(x), dimensions={}\n  y = s32[64]{0} add(i, xb)\n  lo = s32[] constant(3)\n  hi = s32[] constant(40)\n  cl = s32[64]{0} clamp(lo, y, hi)\n  p = pred[64]{0} compare(cl, i), direction=LT\n  z = s32[64]{0} negate(cl)\n  ROOT v = s32[64]{0} select(p, cl, z)"),
    ("u32", "  ru = u32[] convert(r)\n  n = u32[] constant(3)\n  rn = u32[] subtract(ru, n)\n  rb = u32[64]{0} broadcast(rn), dimensions={}\n  x = u32[64]{0} add(i, rb)\n  c7 = u32[] constant(7)\n  cb = u32[64]{0} broadcast(c7), dimensions={}\n  ROOT v = u32[64]{0} remainder(x, cb)"),
    ("s8", "  k = s32[] constant(60)\n  rk = s32[] multiply(r, k)\n  rb = s32[64]{0} broadcast(rk), dimensions={}\n  i32 = s32[64]{0} convert(i)\n  x = s32[64]{0} add(i32, rb)\n  ROOT v = s8[64]{0} convert(x)"),
]


def _program(dtype: str, body: str) -> str:
    return f"HloModule p\n\nENTRY main {{\n  r = s32[] parameter(0)\n  i = {dtype}[64]{{0}} iota(), iota_dimension=0\n{body}\n}}\n"


@pytest.mark.parametrize("case", range(len(EXPRS)))
def test_per_rank_values_match_xla(case: int) -> None:
    pytest.importorskip("jax")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from oracle import run_distributed

    dtype, body = EXPRS[case]
    text = _program(dtype, body)
    c = 4
    got = run_distributed(text, [[np.array(r, np.int32)] for r in range(c)])
    spec = load_relations_text("groups: [[0, 1, 2, 3]]\ninputs:\n  - {distributed: 0, relation: rank}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n")
    module = parse_hlo(text)
    g = build(spec, parse_hlo("HloModule b\n\nENTRY main {\n  ROOT z = s32[] constant(0)\n}\n"), module, {"r"})
    root = g.by_name[("distributed", "v")]
    for r in range(c):
        ev = rankint._Eval(np, g, {"rank": r, "device": r}, rankint.MAX_ELEMENTS)
        v = ev.value(root)
        assert v is not None, f"case {case}: no value on rank {r}"
        np.testing.assert_array_equal(v, np.asarray(got[r][0]).reshape(v.shape), err_msg=f"case {case} rank {r}")


def test_no_value_where_xla_semantics_are_special() -> None:
    """Division by zero and shifts past the width are not followed: no value, never a guess."""
    spec = load_relations_text("groups: [[0, 1]]\ninputs:\n  - {distributed: 0, relation: rank}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n")
    for body in ("  z = s32[64]{0} broadcast(r), dimensions={}\n  ROOT v = s32[64]{0} divide(i, z)",
                 "  k = s32[] constant(40)\n  kr = s32[] add(k, r)\n  z = s32[64]{0} broadcast(kr), dimensions={}\n  ROOT v = s32[64]{0} shift-left(i, z)"):
        text = _program("s32", body)
        g = build(spec, parse_hlo("HloModule b\n\nENTRY main {\n  ROOT z = s32[] constant(0)\n}\n"), parse_hlo(text), {"r"})
        assert rankint._Eval(np, g, {"rank": 0, "device": 0}, rankint.MAX_ELEMENTS).value(g.by_name[("distributed", "v")]) is None


# ---- a position table read by the rank: a reshaped constant table and a rank-offset
# dynamic-slice, against the baseline's iota (the spelling of a per-rank offset table).

POS_BASE = """HloModule pos_base

ENTRY main {
  x = f32[16,8]{1,0} parameter(0)
  pos = s32[16]{0} iota(), iota_dimension=0
  pf = f32[16]{0} convert(pos)
  pb = f32[16,8]{1,0} broadcast(pf), dimensions={0}
  ROOT y = f32[16,8]{1,0} add(x, pb)
}
"""

POS_DIST = """HloModule pos_dist

ENTRY main {
  x = f32[4,8]{1,0} parameter(0)
  rank = s32[] parameter(1)
  tbl = s32[4,4]{1,0} constant({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 }, { 12, 13, 14, 15 } })
  zero = s32[] constant(0)
  row = s32[1,4]{1,0} dynamic-slice(tbl, rank, zero), dynamic_slice_sizes={1,4}
  pos = s32[4]{0} reshape(row)
  pf = f32[4]{0} convert(pos)
  pb = f32[4,8]{1,0} broadcast(pf), dimensions={0}
  ROOT y = f32[4,8]{1,0} add(x, pb)
}
"""


def _check_pos(tmp_path: Path, dist: str) -> Any:
    (tmp_path / "b.hlo").write_text(POS_BASE)
    (tmp_path / "d.hlo").write_text(dist)
    (tmp_path / "r.yaml").write_text(RELATIONS)
    return check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo")


def test_position_table_verified_only_with_the_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _check_pos(tmp_path, POS_DIST).verdict == "verified"
    monkeypatch.setattr(laws, "FAMILIES", [f for f in laws.FAMILIES if f.name != "rankint"])
    monkeypatch.setattr("shardproof.engine.analysis.graph.FAMILIES", laws.FAMILIES)
    assert _check_pos(tmp_path, POS_DIST).verdict == "unproven"


def test_position_table_with_two_rows_swapped_diverged_where_it_is_read(tmp_path: Path) -> None:
    res = _check_pos(tmp_path, POS_DIST.replace("{ 4, 5, 6, 7 }, { 8, 9, 10, 11 }", "{ 8, 9, 10, 11 }, { 4, 5, 6, 7 }"))
    assert res.verdict == "diverged"
    assert res.divergences[0]["instruction"] == "%pos"


# ---- a rank scalar spelled as torch-xla lowers Python's % (remainder plus sign fix-ups):
# (r % 4) * 2 is 2·r on 4 ranks, the offset of the rank's rows.

MOD_BASE = """HloModule mod_base

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  ROOT y = f32[8,4]{1,0} negate(x)
}
"""

MOD_DIST = """HloModule mod_dist

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  r = s32[] parameter(1)
  m = s32[] constant(4)
  am = s32[] abs(m)
  rem = s32[] remainder(r, am)
  ne = pred[] compare(rem, rem), direction=NE
  z0 = s32[] constant(0)
  sg = s32[] sign(rem)
  sgn = s32[] select(ne, z0, sg)
  sm = s32[] sign(m)
  prod = s32[] multiply(sgn, sm)
  lt = pred[] compare(prod, z0), direction=LT
  nu = u8[] convert(lt)
  ns = s32[] convert(nu)
  fix = s32[] multiply(m, ns)
  pm = s32[] add(rem, fix)
  two = s32[] constant(2)
  off = s32[] multiply(pm, two)
  piece = f32[2,4]{1,0} dynamic-slice(x, off, z0), dynamic_slice_sizes={2,4}
  ROOT y = f32[2,4]{1,0} negate(piece)
}
"""

MOD_RELATIONS = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {distributed: r, relation: rank}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
"""


def _check_mod(tmp_path: Path, dist: str) -> Any:
    (tmp_path / "b.hlo").write_text(MOD_BASE)
    (tmp_path / "d.hlo").write_text(dist)
    (tmp_path / "r.yaml").write_text(MOD_RELATIONS)
    return check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo")


def test_python_mod_rank_offset_verified_only_with_the_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _check_mod(tmp_path, MOD_DIST).verdict == "verified"
    monkeypatch.setattr(laws, "FAMILIES", [f for f in laws.FAMILIES if f.name != "rankint"])
    monkeypatch.setattr("shardproof.engine.analysis.graph.FAMILIES", laws.FAMILIES)
    assert _check_mod(tmp_path, MOD_DIST).verdict == "unproven"


def test_python_mod_by_the_wrong_size_diverged_at_the_remainder(tmp_path: Path) -> None:
    # r % 3 on 4 ranks: rank 3 reads rows 0-1; reported at the remainder that reads the wrong
    # modulus (its per-rank values are no rank arithmetic: no fact, the witness confirms).
    res = _check_mod(tmp_path, MOD_DIST.replace("m = s32[] constant(4)", "m = s32[] constant(3)"))
    assert res.verdict == "diverged"
    assert res.divergences[0]["instruction"] == "%rem"


def test_scalar_rows_only_for_exact_forms() -> None:
    rows: dict[str, list[tuple[object, ...]]] = {t: [] for t in rankint.TABLES}
    rankint._scalar_rows(rows, 1, [0, 2, 4, 6])
    rankint._scalar_rows(rows, 2, [4, 0, 1, 2])  # no single form: 4 is no (r + k) mod 4
    rankint._scalar_rows(rows, 3, [1, 2, 3, 0])  # (r + 1) mod 4
    rankint._scalar_rows(rows, 4, [0, 0, 1, 1])  # floor(r / 2)
    rankint._scalar_rows(rows, 5, [0, 1, 0, 1])  # r mod 2: no fact these rules read
    assert rows["rkaff"] == [(1, 2, 0)]
    assert rows["rkmod"] == [(3, 1, 1)]
    assert rows["rkdiv"] == [(4, 2)]
